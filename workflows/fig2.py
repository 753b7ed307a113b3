"""The abstract machine of the paper's Fig. 2: workflow A -> B -> C.

Fig. 2's caption: "GPU memory can hold the KV cache for only one Agent prefix
at a time; each request takes four time units, and each prefix setup takes
one time unit". On the `unit` profile (every engine step costs 1 time unit)
that is: every prefix 100 tokens (1 unit over `fig2_profile`'s 100 B/unit
host link), every request 1 input + 4 output tokens (1 prefill step + 3
decode steps = 4 units). The caption leaves open how many requests fit
beside the prefix: `fig2_profile(batch)` holds one prefix and `batch`
requests (1 to `MAX_BATCH`), never two prefixes. Run it with
`SimBackend(fig2_profile(batch), warm_host=True)` so that every prefix
starts with a host copy (each setup is a 1-unit load).
"""

from __future__ import annotations

from collections.abc import Sequence

from topasd.model import Workflow
from topasd.profiles import HardwareProfile, get_profile
from workflows.spec import workflow_from_dict
from workflows.trace import RoundSpec, TaskRecord, Trace

PREFIX_TOKENS = 100  # 1 unit over `fig2_profile`'s host link
INPUT_TOKENS, OUTPUT_TOKENS = 1, 4  # a request: 1 prefill step + 3 decode steps = 4 units
REQUEST_TOKENS = INPUT_TOKENS + OUTPUT_TOKENS
MAX_BATCH = 10  # two prefixes (200 tokens) never fit beside a request


def fig2_workflow() -> Workflow:
    """Stages a, b, c on agents A, B, C; one request each."""
    stage = {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS}
    return workflow_from_dict({
        "name": "fig2",
        "description": "Fig. 2: A -> B -> C, one prefix fits",
        "agents": {a: {"prefix_tokens": PREFIX_TOKENS} for a in "ABC"},
        "stages": [{"name": "a", "agent": "A", **stage},
                   {"name": "b", "agent": "B", "after": ["a"], **stage},
                   {"name": "c", "agent": "C", "after": ["b"], **stage}],
    })


def fig2_trace(arrivals: Sequence[float]) -> Trace:
    """One task per arrival time (task ids in list order)."""
    wf = fig2_workflow()
    one = (RoundSpec(INPUT_TOKENS, OUTPUT_TOKENS, 0.0),)
    tasks = tuple(TaskRecord(i, wf.name, float(t), {"a": one, "b": one, "c": one})
                  for i, t in enumerate(arrivals))
    return Trace({wf.name: wf}, tasks, {"workload": "fig2", "tasks": len(tasks)})


def fig2_budget(batch: int) -> int:
    """KV tokens for one prefix and `batch` requests (1 to `MAX_BATCH`); two
    prefixes and a request never fit."""
    if not (isinstance(batch, int) and 1 <= batch <= MAX_BATCH):
        raise ValueError(f"batch={batch!r}: Fig. 2 holds one prefix and 1 to {MAX_BATCH} "
                         "requests")
    return PREFIX_TOKENS + batch * REQUEST_TOKENS


def fig2_profile(batch: int) -> HardwareProfile:
    """The `unit` profile (1 unit per engine step) with room for one prefix
    and `batch` requests, and a host link that moves a prefix in 1 unit."""
    unit = get_profile("unit")
    return unit.with_overrides(budget_tokens=fig2_budget(batch),
                               swap_bytes_per_s=PREFIX_TOKENS * unit.kv_bytes_per_token)
