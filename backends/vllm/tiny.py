"""A tiny Qwen2-style model directory: a `config.json` and nothing else.

vLLM loads it with `load_format="dummy"` (random weights, nothing read from
disk) and `skip_tokenizer_init=True` (token ids in, token ids out), so a real
engine runs on a laptop CPU without downloading anything. Its outputs are
meaningless; its step times, KV blocks, prefix cache and scheduler are real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from topasd.model import TopasError

# vLLM 0.32's CPU attention (CPUAttentionBackend.get_supported_head_sizes): another
# head size passes the engine's start-up and fails its first forward pass
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

TINY_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,  # head size 32: the smallest vLLM's CPU attention takes
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 8192,
    "max_window_layers": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "use_sliding_window": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_tiny_model(directory: str | Path, *, layers: int = 2, hidden: int = 128,
                     vocab: int = 2048, max_len: int = 8192) -> Path:
    """Write a tiny Qwen2 `config.json` into `directory` (created if missing)."""
    if hidden % 64 or hidden < 64:  # hidden/32 query heads, hidden/64 key/value heads
        raise TopasError(f"--hidden must be a multiple of 64 (>= 64), got {hidden}: the "
                         "key/value heads must divide the query heads")
    if layers < 1 or vocab < 64 or max_len < 256:
        raise TopasError("the tiny model needs layers >= 1, vocab >= 64 and max_len >= 256")
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise TopasError(f"{path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TopasError(f"cannot create the model directory {path} ({exc.strerror}); give "
                         "another -o") from None
    config = dict(TINY_CONFIG, num_hidden_layers=layers, max_window_layers=layers,
                  hidden_size=hidden, intermediate_size=2 * hidden,
                  num_attention_heads=hidden // 32, num_key_value_heads=max(1, hidden // 64),
                  vocab_size=vocab, max_position_embeddings=max_len)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def read_model_config(model: str | Path) -> dict[str, Any]:
    """The `config.json` of a model directory, with a one-line error if unusable."""
    path = Path(model)
    if not path.exists():
        raise TopasError(f"model {path}: no such directory; write one with "
                         f"`topasd model tiny -o {path}`")
    if not path.is_dir():
        raise TopasError(f"model {path}: not a directory (expected a model directory "
                         "holding config.json)")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise TopasError(f"model {path}: no config.json in it; write a tiny model with "
                         f"`topasd model tiny -o {path}`")
    try:
        data = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TopasError(f"model {path}: config.json is not readable JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("vocab_size"), int):
        raise TopasError(f"model {path}: config.json lacks an integer vocab_size")
    head = head_size(data)
    if head is not None and head not in CPU_HEAD_SIZES:
        raise TopasError(f"model {path}: head size {head} (hidden_size / num_attention_heads"
                         f" or head_dim), but vLLM's CPU attention takes only "
                         f"{', '.join(map(str, CPU_HEAD_SIZES))}; `topasd model tiny` "
                         "writes heads of 32")
    return data


def head_size(cfg: dict[str, Any]) -> int | None:
    """The attention head size a config gives (None: it does not say)."""
    head = cfg.get("head_dim")
    if isinstance(head, int):
        return head
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None
