"""Contract tests against SGLang 0.5.23's own classes, run by the SGLang venv's
pytest (`.venv-sglang/bin/python -m pytest tests/sglang`; the main suite reaches
them through tests/test_sglang_contract.py). Without SGLang installed nothing
here is collected.

`CpuEngine` holds real SGLang objects (Req, ScheduleBatch, PrefillAdder,
UnifiedRadixCache, TokenToKVPoolAllocator, ReqToTokenPool) on the CPU and
performs the scheduler's bookkeeping steps with SGLang's functions; only the
model forward is left out (outputs are a fixed token).
"""

from __future__ import annotations

import importlib.util
from array import array
from collections.abc import Sequence
from typing import Any

if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    import pytest

    @pytest.fixture
    def engine() -> Any:
        return CpuEngine()


PREFIXES = {"plan": list(range(1000, 1040)), "code": list(range(2000, 2032)),
            "test": list(range(3000, 3024))}


class CpuEngine:
    """A Scheduler-shaped holder of real SGLang objects (the attributes the
    adapter uses, with SGLang's names), driven without a model."""

    def __init__(self, kv_size: int = 512, max_prefill_tokens: int = 16384,
                 chunked_prefill_size: int | None = 8192) -> None:
        import torch
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import (
            NewTokenRatioTracker,
        )
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=1))
        self.req_to_token_pool = ReqToTokenPool(size=16, max_context_len=1024, device="cpu",
                                                enable_memory_saver=False)
        kv = MHATokenToKVPool(size=kv_size, page_size=1, dtype=torch.bfloat16, head_num=1,
                              head_dim=8, layer_num=1, device="cpu", enable_memory_saver=False)
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
            size=kv_size, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False)
        self.tree_cache = UnifiedRadixCache(params=CacheInitParams(
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            page_size=1, disable=False, tree_components=(ComponentType.FULL,)))
        self.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
        self.waiting_queue: list[Any] = []
        self.chunked_req = None
        self.new_token_ratio_tracker = NewTokenRatioTracker(init=0.7, min=0.098, decay=0.001,
                                                           current=0.7)
        self.max_prefill_tokens = max_prefill_tokens
        self.chunked_prefill_size = chunked_prefill_size
        self.enable_hierarchical_cache = False
        self.page_size = 1
        self.passes: list[list[str]] = []  # rids of each prefill batch, in order

    # -------------------------------------------------------------- requests

    def submit(self, meta: Any, dynamic: Sequence[int], max_new: int, *,
               via: str = "kv_hints") -> Any:
        """A Req as the scheduler builds it, carrying `meta` on `via`."""
        from sglang.srt.managers.kv_hints import decode_kv_hints_envelope
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        from backends.sglang.metadata import custom_params, kv_hints_envelope

        extra = {"custom_params": custom_params(meta)} if via == "custom_params" else {}
        sp = SamplingParams(max_new_tokens=max_new, ignore_eos=True, **extra)
        sp.normalize(None)
        hints = decode_kv_hints_envelope(kv_hints_envelope(meta)) if via == "kv_hints" else None
        ids = array("q", PREFIXES[meta.agent][: meta.prefix_tokens] + list(dynamic))
        req = Req(f"rid-{meta.request_id}", "", ids, sp, vocab_size=50_000, kv_hints=hints)
        self._add_request_to_queue(req)
        return req

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> None:
        """The NULL-disaggregation branch of Scheduler._add_request_to_queue."""
        self.waiting_queue.append(req)

    # ------------------------------------------------------ scheduler steps

    def prefill_pass(self, prefill_delayer_single_pass: Any = None,
                     running_batch: Any = None) -> tuple[Any, Any]:
        """Scheduler._get_new_batch_prefill_raw's core on the pass's
        `running_batch` (default: `self.running_batch`): walk the waiting queue
        through a PrefillAdder, then init/prepare the extend batch and run it
        (one output token each, KV checkpointed). Returns (the new batch or
        None, the running batch) as SGLang does, without merging them: SGLang
        merges at the next `get_next_batch_to_run` (`end_pass` here)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        running = self.running_batch if running_batch is None else running_batch
        self.running_batch = running
        adder = PrefillAdder(self.page_size, self.tree_cache, self.token_to_kv_pool_allocator,
                             running, self.new_token_ratio_tracker.current,
                             self.max_prefill_tokens, self.chunked_prefill_size)
        for req in self.waiting_queue:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            req.init_next_round_input(self.tree_cache)
            res = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = len(adder.can_run_list) > 0 or not running.is_empty()
                break
        can_run = list(adder.can_run_list)
        if not can_run:
            return None, running
        assert adder.new_chunked_req is None, "the CPU engine runs whole prefills only"
        chosen = set(map(id, can_run))
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in chosen]
        batch = ScheduleBatch.init_new(can_run, self.req_to_token_pool,
                                       self.token_to_kv_pool_allocator, self.tree_cache,
                                       _ModelConfig(), False, _spec_none())
        batch.prepare_for_extend()
        for req in batch.reqs:
            req.output_ids.append(7)
            checkpoint_kv_cache(req, self.tree_cache)
        self.passes.append([r.rid for r in can_run])
        return batch, running

    def end_pass(self, result: tuple[Any, Any]) -> Any:
        """What SGLang's loop does with a pass's result: store the running
        batch, and merge the new batch into it (at the next
        `get_next_batch_to_run`). Returns the new batch (or None)."""
        batch, running = result
        self.running_batch = running
        if batch is not None:
            if running.is_empty():
                self.running_batch = batch
            else:
                running.merge_batch(batch)
        return batch

    def decode_step(self) -> None:
        """One decode step of the running batch (allocate, emit a token)."""
        batch = self.running_batch
        if batch.is_empty():
            return
        batch.prepare_for_decode()
        for req in batch.reqs:
            req.output_ids.append(8)

    def waiting_rids(self) -> list[str]:
        return [r.rid for r in self.waiting_queue]

    def running_rids(self) -> list[str]:
        return [r.rid for r in self.running_batch.reqs]


class _ModelConfig:
    vocab_size = 50_000
    is_encoder_decoder = False
    hf_eos_token_id = None


def _spec_none() -> Any:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.NONE
