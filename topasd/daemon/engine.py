"""The engine a daemon runs and what bounds the requests it takes."""

from __future__ import annotations

from dataclasses import dataclass

from backends.base import Backend, EngineLimits
from backends.sim.engine import SimBackend
from topasd.config import Settings
from topasd.model import Workflow
from topasd.profiles import HardwareProfile


def make_backend(settings: Settings, profile: HardwareProfile) -> Backend:
    """The engine `settings.backend` names: the simulator, an in-process vLLM
    engine on `model_path` (docs/vllm.md), or SGLang (docs/sglang.md)."""
    if settings.backend == "sim":
        return SimBackend(profile)
    if settings.backend == "vllm":
        from backends.vllm import POOL_TOKENS
        from backends.vllm import make_backend as vllm_backend

        budget = settings.budget or POOL_TOKENS
        return vllm_backend(str(settings.model_path), budget_tokens=budget,
                            profile=profile.with_overrides(budget_tokens=budget))
    from backends.sglang import local_options
    from backends.sglang import make_backend as sglang_backend

    options = local_options(str(settings.model_path), settings.budget,
                            tp_size=settings.tp_size, dp_size=settings.dp_size,
                            mem_fraction_static=settings.mem_fraction,
                            enable_hierarchical_cache=settings.hicache,
                            hicache_size=settings.hicache_size)
    return sglang_backend(options, profile)


@dataclass(frozen=True, slots=True)
class RequestLimit:
    """The longest request (prefix + input + output) the engine takes: the KV
    budget, or a shorter context (vLLM's max_model_len); how to name it; its fix."""

    tokens: int
    what: str
    fix: str


def request_limit(budget: int, limits: EngineLimits) -> RequestLimit:
    """The KV budget, or the engine's context when shorter."""
    context = limits.context_tokens
    if context is not None and context < budget:
        return RequestLimit(context, f"the engine's context (max_model_len) is {context}",
                            "use a model with a longer context")
    return RequestLimit(budget, f"the KV budget is {budget}",
                        "raise --budget or use a larger profile")


def never_fits(wf: Workflow, limit: RequestLimit) -> str | None:
    """Why no request of some stage of `wf` can ever fit `limit` (its prefix
    plus the least input and output it can draw), or None."""
    for v in wf.topo_order:
        stage = wf.stages[v]
        prefix = wf.agents[stage.agent].prefix_tokens
        p = stage.profile
        least = prefix + max(1, round(p.input_tokens.least())) + max(
            1, round(p.output_tokens.least()))
        if least > limit.tokens:
            return (f"workflow {wf.name!r}, stage {v!r}: even its smallest request needs "
                    f"{least} KV tokens (the prefix of agent {stage.agent!r}, {prefix}, + input "
                    f"+ output) but {limit.what}; {limit.fix}, or shrink the workflow")
    return None


def engine_profile(profile: HardwareProfile, limits: EngineLimits,
                   budget: int | None) -> HardwareProfile:
    """`profile` with the KV pool the engine reports, so that fit checks match
    the engine. SGLang sizes its pool from GPU memory, and a --budget below it
    stays; vLLM's pool is the --budget rounded up to whole blocks
    (`pool_from_budget`), all of it usable."""
    pool = limits.pool_tokens
    if pool is None or pool == profile.budget_tokens:
        return profile
    if budget is not None and not limits.pool_from_budget:
        pool = min(budget, pool)
    return profile.with_overrides(budget_tokens=pool)
