"""The vLLM backend's pure parts (no vLLM needed): synthetic tokens, the tiny
model directory, KV accounting in blocks, the test workload and CLI errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from backends.vllm import read_model_config, write_tiny_model
from backends.vllm.sizing import kv_footprint, pool_tokens, shared_prefix_tokens
from backends.vllm.tokens import RESERVED_IDS, SyntheticTokens
from backends.vllm.workload import DEFAULT_BUDGET, chain3_cpu
from topasd.cli import main
from topasd.model import Request, TopasError


def _req(rid: int, agent: str = "A", prefix: int = 64, inp: int = 10, out: int = 5) -> Request:
    return Request(id=rid, task_id=0, workflow="w", stage="s", agent=agent, round=0,
                   input_tokens=inp, output_tokens=out, ready_at=0.0, task_arrival=0.0,
                   prefix_tokens=prefix)


def test_an_agent_prefix_is_the_same_ids_for_every_request_and_differs_between_agents() -> None:
    tok = SyntheticTokens(vocab_size=2048, seed=3)
    a1, a2 = tok.prompt(_req(1)), tok.prompt(_req(2))
    b = tok.prompt(_req(3, agent="B"))
    assert a1[:64] == a2[:64] == SyntheticTokens(2048, seed=3).prefix("A", 64)
    assert a1[64:] != a2[64:]  # fresh input per request
    assert a1[:64] != b[:64]
    assert len(a1) == 64 + 10
    assert all(RESERVED_IDS <= t < 2048 for t in a1 + b)


def test_a_prompt_keeps_one_fresh_token_when_the_input_is_empty() -> None:
    tok = SyntheticTokens(vocab_size=100)
    assert len(tok.prompt(_req(1, prefix=32, inp=0))) == 33
    with pytest.raises(ValueError, match="vocab_size"):
        SyntheticTokens(vocab_size=RESERVED_IDS)


def test_the_tiny_model_directory_round_trips(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m", layers=3, hidden=256, vocab=512)
    cfg = read_model_config(path)
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (3, 256, 512)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    for hidden in (100, 160):  # 160: 5 query heads over 2 key/value heads
        with pytest.raises(TopasError, match="multiple of 64"):
            write_tiny_model(tmp_path / "bad", hidden=hidden)


@pytest.mark.parametrize(("setup", "message"), [
    (lambda p: None, "no such directory"),
    (lambda p: p.write_text("x"), "not a directory"),
    (lambda p: p.mkdir(), "no config.json"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("{oops")), "not readable JSON"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("{}")), "vocab_size"),
    # it started, then the first forward pass failed with a traceback
    (lambda p: (p.mkdir(), (p / "config.json").write_text(json.dumps(
        {"vocab_size": 64, "hidden_size": 64, "num_attention_heads": 4}))),
     r"head size 16 .* takes only 32, 64"),
])
def test_an_unusable_model_directory_is_one_clear_error(tmp_path: Path, setup: object,
                                                        message: str) -> None:
    path = tmp_path / "model"
    setup(path)  # type: ignore[operator]
    with pytest.raises(TopasError, match=message):
        read_model_config(path)


def test_kv_accounting_is_in_whole_blocks() -> None:
    assert shared_prefix_tokens(512, 32) == 512
    assert shared_prefix_tokens(500, 32) == 480
    assert kv_footprint(_req(1, prefix=512, inp=64, out=64), 32) == 128
    # a 20-token partial prefix block, 13 input and 5 output tokens: two blocks
    assert kv_footprint(_req(1, prefix=500, inp=13, out=5), 32) == 64
    assert pool_tokens(1000, 32) == 1024


@given(prefix=st.integers(0, 5000), inp=st.integers(0, 3000), out=st.integers(1, 3000),
       block=st.sampled_from([32, 64, 128]))
def test_the_footprint_covers_the_request_by_less_than_one_block(prefix: int, inp: int,
                                                                 out: int, block: int) -> None:
    req = _req(1, prefix=prefix, inp=inp, out=out)
    held = prefix - shared_prefix_tokens(prefix, block) + max(1, inp) + out
    foot = kv_footprint(req, block)
    assert foot % block == 0
    assert held <= foot < held + block


def test_the_test_workload_forces_a_residency_choice_in_the_default_pool() -> None:
    tr = chain3_cpu(tasks=5, seed=2, input_tokens=64, output_tokens=64)
    wf = tr.workflows["chain3-cpu"]
    prefix = wf.agents["A"].prefix_tokens
    request = kv_footprint(_req(0, prefix=prefix, inp=64, out=64), 32)
    assert 2 * prefix + request > DEFAULT_BUDGET  # two agents do not fit together
    assert prefix + 4 * request <= DEFAULT_BUDGET  # one agent and four requests do
    assert len(tr.tasks) == 5
    assert all(r.output_tokens == 64 for t in tr.tasks for rs in t.stages.values() for r in rs)


# ------------------------------------------------------------------- CLI


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_model_tiny_writes_a_config(tmp_path: Path) -> None:
    code, out = _invoke("model", "tiny", "-o", str(tmp_path / "tiny"))
    assert code == 0, out
    assert json.loads((tmp_path / "tiny" / "config.json").read_text())["model_type"] == "qwen2"


@pytest.mark.parametrize(("args", "message"), [
    (["--backend", "vllm"], "--backend vllm needs --model DIR"),
    (["--backend", "vllm", "--model", "{missing}"], "no such directory"),
    (["--backend", "vllm", "--model", "{empty}"], "no config.json"),
    (["--model", "{empty}"], "--model needs --backend vllm"),
])
def test_replay_with_a_bad_vllm_model_fails_with_one_line(tmp_path: Path, args: list[str],
                                                          message: str) -> None:
    (tmp_path / "empty").mkdir()
    filled = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty") for a in args]
    code, out = _invoke("replay", "--workload", "chain3", "--tasks", "2", *filled)
    assert code == 2
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out


def test_a_vllm_start_up_error_keeps_its_cause_and_names_the_flag() -> None:
    """vLLM's validation errors say why on their second line; a memory refusal
    names vLLM's own flags, which topasd sets from --budget."""
    from backends.vllm.backend import _startup_cause

    why = _startup_cause(ValueError("1 validation error for ModelConfig\n  Value error, Model "
                                    "architectures ['FooForCausalLM'] are not supported"))
    assert why.startswith("1 validation error for ModelConfig; Value error, Model "
                          "architectures ['FooForCausalLM'] are not supported")
    mem = _startup_cause(RuntimeError("not enough memory: decrease --kv-cache-memory-bytes"))
    assert mem.endswith("(topasd sizes that memory from --budget: lower --budget)")
    assert _startup_cause(RuntimeError("")) == "RuntimeError"


def test_the_head_sizes_read_model_config_takes_are_vllms() -> None:
    """The list kept to check models before vLLM is imported is vLLM's own."""
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from backends.vllm.tiny import CPU_HEAD_SIZES

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == CPU_HEAD_SIZES
