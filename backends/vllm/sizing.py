"""Sizes and costs of the vLLM backend, without vLLM: the KV pool a budget
gets, a model's context, a request's KV footprint in blocks, and the fitted
cost profile of the tiny CPU model (`cpu_profile`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from topasd.model import Request, Segment
from topasd.profiles import HardwareProfile


def cpu_profile(budget_tokens: int, chunk_tokens: int,
                model_config: Mapping[str, Any] | None = None) -> HardwareProfile:
    """Step-time costs of the tiny model on a 2-core CPU (fitted by
    `bench/sim_vs_vllm.py --fit`; refit for another machine or model), with the
    engine settings the vLLM backend runs: whole-output reservation (ratio 1),
    prefill mixed with decode in one step, no host copy (recompute)."""
    kv_bytes = kv_bytes_per_token(model_config or {})
    return HardwareProfile(
        name="vllm-cpu-tiny",
        description="the tiny dummy-weight Qwen2 on vLLM's CPU backend, 2 cores",
        t_weights_s=0.0,
        t_lin_per_token_s=CPU_FIT["lin"],
        t_attn_per_pair_s=CPU_FIT["attn"],
        t_kv_read_per_token_s=CPU_FIT["kv"],
        t_overhead_s=CPU_FIT["overhead"],
        kv_bytes_per_token=float(kv_bytes),
        swap_bytes_per_s=1e12,  # no host link: a kept prefix comes back at once
        budget_tokens=budget_tokens,
        chunk_tokens=chunk_tokens,
        max_prefill_tokens=chunk_tokens,
        host_cache=False,
        keep_evicted=True,  # the backend keeps an evicted prefix's blocks pinned
        init_new_token_ratio=1.0,
        min_new_token_ratio=1.0,
        mixed_chunk=True,
    )


# Step-time coefficients measured on the development machine (2-core AMD EPYC)
# by `python bench/sim_vs_vllm.py --fit`; see docs/RESULTS.md for the fit.
CPU_FIT: dict[str, float] = {"overhead": 1.343e-3, "lin": 1.674e-6, "attn": 21.65e-9,
                             "kv": 78.07e-9}


def shared_prefix_tokens(prefix_tokens: int, block_size: int) -> int:
    """Prefix tokens vLLM shares between an agent's requests: its full blocks."""
    return prefix_tokens // block_size * block_size


def kv_footprint(req: Request, block_size: int) -> int:
    """KV tokens a request holds at its end beyond the shared blocks (its agent
    prefix's and its shared segments'), in whole blocks: its partial last
    shared block, fresh input (at least one token: the prompt's last token is
    always computed) and output."""
    shared = req.prefix_tokens + req.input_tokens - req.own_input
    tail = shared - shared_prefix_tokens(shared, block_size)
    tail += max(1, req.own_input)
    return math.ceil((tail + req.output_tokens) / block_size) * block_size


def shared_segments(req: Request, block_size: int) -> tuple[Segment, ...]:
    """A request's shared segments as vLLM shares them: each copy the whole
    blocks its segment completes after the prefix and the segments before it
    (a block is shared once all its tokens are common)."""
    out, end = [], req.prefix_tokens
    for seg in req.shared:
        start, end = end, end + seg.tokens
        out.append(Segment(seg.key, shared_prefix_tokens(end, block_size)
                           - shared_prefix_tokens(start, block_size)))
    return tuple(out)


def context_tokens(cfg: Mapping[str, Any], budget_tokens: int, block_size: int = 32) -> int:
    """vLLM's max_model_len for this model and KV budget: the model's context
    (max_position_embeddings), capped by the pool."""
    pool = pool_tokens(budget_tokens, block_size)
    return min(int(cfg.get("max_position_embeddings", pool)), pool)


def context_fix(context: int, budget_tokens: int, block_size: int = 32) -> str:
    """How to make room for a request longer than `context` tokens (the
    context of `context_tokens` for the same budget and block size)."""
    if context >= pool_tokens(budget_tokens, block_size):
        return "the KV pool caps it: give a larger --budget, or shorten the request"
    return ("the model's max_position_embeddings caps it: shorten the request, or use a "
            "model config with a longer context")


def pool_tokens(budget_tokens: int, block_size: int = 32) -> int:
    """The KV pool a `budget_tokens` request gets: rounded up to whole blocks."""
    return math.ceil(budget_tokens / block_size) * block_size


def kv_bytes_per_token(cfg: Mapping[str, Any]) -> int:
    """K and V of one token over all layers, float32 (the dtype the backend runs)."""
    layers = int(cfg.get("num_hidden_layers", 2))
    heads = int(cfg.get("num_attention_heads", 4))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head = int(cfg.get("head_dim") or int(cfg.get("hidden_size", 128)) // max(1, heads))
    return 2 * layers * kv_heads * head * 4
