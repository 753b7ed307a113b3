"""vLLM v1 backend: TOPAS as vLLM's `scheduler_cls` (see docs/vllm.md).

Importing this package does not import vLLM; `make_backend` does.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from backends.vllm.tiny import read_model_config, write_tiny_model

if TYPE_CHECKING:
    from backends.vllm.backend import VllmBackend

__all__ = ["POOL_TOKENS", "available", "make_backend", "read_model_config", "write_tiny_model"]

POOL_TOKENS = 16384  # default KV pool of `replay`/`start --backend vllm`, tokens


def available() -> bool:
    """Whether vLLM is installed (the `vllm` extra: `pip install -e '.[vllm]'`)."""
    return importlib.util.find_spec("vllm") is not None


def make_backend(model: str, **options: Any) -> VllmBackend:
    """A `VllmBackend` on the model directory `model` (options: budget_tokens,
    block_size, chunk_tokens, max_num_seqs, profile, clock, native, seed, audit,
    record)."""
    read_model_config(model)  # one-line errors before vLLM is imported
    from backends.vllm.backend import VllmBackend

    return VllmBackend(model, **options)
