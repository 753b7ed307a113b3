"""A name-only stand-in for `sgl_kernel`, for SGLang 0.5.23's CPU engine in tests.

SGLang imports these nine `*_cpu` names at module level (speculative decoding
and KV-move helpers); the CPU engine path the tests run never calls them
(/work/shared/sglang-cpu/RECIPE.md). Each raises if called, so a path that
does reach a compiled kernel fails loudly. It registers no `torch.ops`, so
`cpu_has_amx_support()` stays False and SGLang uses its native-torch paths.

Only the CPU-engine test fixture (tests/sglang_engine/conftest.py) puts this
directory on the path; it is never installed, and a GPU install keeps the real
kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

__version__ = "0.0.0+stub"
STUB = True
NAMES = ("copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu",
         "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu",
         "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu",
         "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
         "rotate_input_ids_cpu")


def _missing(name: str) -> Callable[..., NoReturn]:
    def kernel(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel stub: SGLang called sgl_kernel.{name}, a compiled kernel the "
            "test stand-in does not have; this engine path needs the real sglang-kernel")

    kernel.__name__ = name
    return kernel


for _name in NAMES:
    globals()[_name] = _missing(_name)
