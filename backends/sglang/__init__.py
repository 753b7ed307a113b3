"""The SGLang backend: TOPAS inside SGLang 0.5.23's scheduler (docs/sglang.md).

Pieces: `metadata` (workflow metadata on each request, via kv_hints),
`adapter` (the scheduler-side view and decision execution), `plugin` (SGLang's
plugin entry point and the scheduler hook), `channel` (scheduler <-> daemon),
`backend` (the daemon-side Backend that runs an in-process SGLang Engine).
Importing this package does not import SGLang.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topasd.model import TopasError
from topasd.profiles import HardwareProfile

if TYPE_CHECKING:
    from backends.sglang.backend import SGLangBackend

SUPPORTED_SGLANG = "0.5.23"  # the one version the contract tests pin
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"  # SGLang's own switch to its CPU platform

# what SGLang 0.5.23's engine needs on a CPU without its compiled kernels
# (docs/sglang.md, "On a CPU"): native-torch attention and sampling, no CUDA
# graphs, no overlap of scheduling and forward, token ids in and out
CPU_ENGINE_ARGS: dict[str, Any] = {
    "device": "cpu", "attention_backend": "torch_native", "sampling_backend": "pytorch",
    "disable_cuda_graph": True, "disable_overlap_schedule": True, "skip_tokenizer_init": True,
}
CPU_MEM_FRACTION = 0.1  # on the CPU, mem_fraction_static is a fraction of system RAM
CPU_POOL_TOKENS = 16384  # the KV pool on the CPU when no --budget caps it (tokens)

# SGLang options the adapter cannot serve, and why (each would make SGLang's own
# scheduler disagree with TOPAS's decisions, or the ranks disagree with each other)
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "enable_dp_attention": (False, "attention-DP ranks hold different queues, while the "
                            "adapter syncs a decision over the whole TP group; use dp_size "
                            "(replicas) instead"),
    "pp_size": (1, "every pipeline stage would ask the daemon on its own"),
    "disaggregation_mode": ("null", "prefill/decode disaggregation is not supported"),
    "enable_priority_scheduling": (False, "SGLang would re-sort TOPAS's admission order"),
    "enable_priority_preemption": (False, "SGLang would preempt beside TOPAS"),
    "speculative_algorithm": (None, "speculative decoding keys the radix cache differently "
                              "from the agent prefixes TOPAS pins"),
    "enable_lora": (None, "LoRA requests are cached under their adapter, not under the "
                    "agent prefixes TOPAS pins"),
    "schedule_policy": ("fcfs", "TOPAS orders admissions itself; SGLang's policy must "
                        "leave the queue order alone"),
}


@dataclass(frozen=True, slots=True)
class SGLangOptions:
    """SGLang options `topasd start --backend sglang` passes through (names as
    SGLang's `ServerArgs`)."""

    model_path: str
    tp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: float | None = None
    enable_hierarchical_cache: bool = False
    hicache_size: int | None = None  # GB of host KV pool per rank (0/None: hicache_ratio)
    hicache_ratio: float | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    page_size: int | None = None
    load_format: str | None = None  # "dummy": random weights (the GPU check)
    context_length: int | None = None
    max_total_tokens: int | None = None  # caps the KV pool (tokens)
    device: str | None = None  # "cpu": SGLang's CPU engine (CPU_ENGINE_ARGS)
    extra: dict[str, Any] = field(default_factory=dict)  # any other ServerArgs field

    def __post_init__(self) -> None:
        for name, value in self.extra.items():
            if name in UNSUPPORTED and value not in (UNSUPPORTED[name][0], None, False):
                default, why = UNSUPPORTED[name]
                raise TopasError(f"SGLang option {name}={value!r} is not supported with "
                                 f"topasd: {why}. Leave it at {default!r}")

    def server_args(self) -> dict[str, Any]:
        """Keyword arguments for `sglang.Engine` (None means SGLang's default)."""
        args: dict[str, Any] = {
            "model_path": self.model_path, "tp_size": self.tp_size, "dp_size": self.dp_size,
            "enable_hierarchical_cache": self.enable_hierarchical_cache,
            # TOPAS orders admissions itself; SGLang's FCFS leaves the queue order alone
            "schedule_policy": "fcfs",
        }
        optional = {
            "mem_fraction_static": self.mem_fraction_static, "hicache_size": self.hicache_size,
            "hicache_ratio": self.hicache_ratio,
            "max_running_requests": self.max_running_requests,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens, "page_size": self.page_size,
            "load_format": self.load_format, "context_length": self.context_length,
            "max_total_tokens": self.max_total_tokens,
        }
        if self.device == "cpu":
            args.update(CPU_ENGINE_ARGS)
            args["mem_fraction_static"] = CPU_MEM_FRACTION
        elif self.device is not None:
            args["device"] = self.device
        args.update({k: v for k, v in optional.items() if v is not None})
        args.update(self.extra)
        return args


def on_cpu() -> bool:
    """Whether SGLang runs its CPU engine here (`SGLANG_USE_CPU_ENGINE=1`)."""
    return os.environ.get(CPU_ENGINE_ENV) == "1"


def has_weights(model_path: str) -> bool:
    """Whether a model directory holds weight files (else: a config-only
    directory such as `topasd model tiny` writes, run with dummy weights).
    A hub name (not a directory) counts as having weights."""
    path = Path(model_path)
    if not path.is_dir():
        return True
    return any(path.glob("*.safetensors")) or any(path.glob("*.bin")) or \
        any(path.glob("*.pt"))


def local_options(model_path: str, budget: int | None = None, **rest: Any) -> SGLangOptions:
    """Options for the engine on this machine: SGLang's CPU engine when
    `SGLANG_USE_CPU_ENGINE=1` (its pool `budget`, default CPU_POOL_TOKENS),
    dummy weights for a config-only model directory; `rest` as SGLangOptions."""
    cpu = on_cpu()
    return SGLangOptions(model_path=model_path, device="cpu" if cpu else None,
                         load_format=None if has_weights(model_path) else "dummy",
                         max_total_tokens=budget or (CPU_POOL_TOKENS if cpu else None),
                         **rest)


def make_backend(options: SGLangOptions, profile: HardwareProfile,
                 **kwargs: Any) -> SGLangBackend:
    """The daemon-side SGLang backend (starts an in-process SGLang Engine);
    the profile's cost hints feed the policy."""
    missing = [m for m in ("sglang", "zmq") if importlib.util.find_spec(m) is None]
    if missing:
        raise TopasError(f"the SGLang backend needs SGLang {SUPPORTED_SGLANG} (not installed: "
                         f"{', '.join(missing)}): pip install -e '.[sglang]' on a GPU "
                         "machine (docs/sglang.md)")
    from backends.sglang.backend import SGLangBackend

    return SGLangBackend(options, profile, **kwargs)


__all__ = ["CPU_ENGINE_ARGS", "CPU_POOL_TOKENS", "SUPPORTED_SGLANG", "SGLangOptions", "has_weights",
           "local_options", "make_backend", "on_cpu"]
