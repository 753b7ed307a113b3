"""Chain-3 shrunk for the tiny CPU model: the workload of the vLLM tests and benches.

Same shape as `workflows/builtin/chain3.yaml` (A -> B -> C, equal stages, one
round each); sizes fit a deliberately small KV pool: with the default
1,024-token pool, one 512-token agent prefix plus four requests fit, two
prefixes and a request do not, so the policy must choose which agent stays
resident. Sizes are multiples of vLLM's 32-token block, so the simulator and
vLLM account for the same KV.
"""

from __future__ import annotations

from workflows.spec import workflow_from_dict
from workflows.trace import Trace, generate_trace

DEFAULT_BUDGET = 1024  # KV pool of the tests and benches, tokens


def chain3_cpu(tasks: int = 6, rate: float = 40.0, seed: int = 0, *, prefix: int = 512,
               input_tokens: int = 96, output_tokens: int = 32) -> Trace:
    """A Poisson trace of `tasks` Chain-3 tasks sized for the tiny CPU model."""
    stage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    spec = {
        "name": "chain3-cpu",
        "description": "Chain-3 (A -> B -> C) sized for the tiny CPU model",
        "agents": {a: {"prefix_tokens": prefix} for a in "ABC"},
        "stages": [
            {"name": "a", "agent": "A", **stage},
            {"name": "b", "agent": "B", "after": ["a"], **stage},
            {"name": "c", "agent": "C", "after": ["b"], **stage},
        ],
    }
    wf = workflow_from_dict(spec, "chain3-cpu")
    return generate_trace([wf], rate, tasks, seed, name="chain3-cpu")
