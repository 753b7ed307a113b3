"""A test-only SGLang plugin: HiCache's host pool on a CPU (SGLang 0.5.23).

SGLang's hierarchical cache does not run on a CPU as shipped; two calls in
its host pool need CUDA (/work/shared/sglang-cpu/RECIPE.md):

- `pool_host.common._cuda_host_register` pins the host pool with
  `torch.cuda.cudart().cudaHostRegister` ("Found no NVIDIA driver"). Here it
  does nothing: the pool is already host memory, and pinning only speeds up
  DMA to a GPU, which there is none of.
- `pool_host.mha.transfer_kv_direct` (the `direct` I/O backend's copy, for
  the `layer_first` layout) comes from `sgl_kernel.kvcacheio`, imported only
  on CUDA/HIP, so on a CPU the name is missing. Here it is the same copy in
  torch: for each layer, `dst[dst_indices] = src[src_indices]`.

Everything else (the host pool, HiCache's radix tree, its write-through
backup, load-back inside SGLang's admission) is SGLang's own code. Only
tests/sglang_engine/conftest.py puts this directory on the path (of the
processes SGLang spawns for the HiCache engine); SGLang's plugin loader finds
the entry point in the `.dist-info` beside this file. Never installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PATCHED = ("sglang.srt.mem_cache.pool_host.common._cuda_host_register",
           "sglang.srt.mem_cache.pool_host.mha.transfer_kv_direct")


def _no_host_register(buffer: Any, registration_granularity_bytes: int | None = None) -> None:
    """No page-locking on a CPU: the host pool is ordinary memory already."""


def transfer_kv_direct(src_layers: Sequence[Any], dst_layers: Sequence[Any], src_indices: Any,
                       dst_indices: Any, page_size: int = 1) -> None:
    """`sgl_kernel.kvcacheio.transfer_kv_direct` in torch: copy the token rows
    `src_indices` of each source layer to rows `dst_indices` of its destination
    (indices are token slots, whatever the page size)."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)].to(dst.device)


def register() -> None:
    """SGLang's plugin entry point: replace the two CUDA-only functions."""
    from sglang.srt.mem_cache.pool_host import common, mha

    common._cuda_host_register = _no_host_register  # type: ignore[attr-defined]
    mha.transfer_kv_direct = transfer_kv_direct  # type: ignore[attr-defined]
