"""Hardware profiles: the step-time model of CALIBRATION.md and engine knobs.

A profile is pure data plus closed-form step-time functions; the simulator
executes them and policies read `CostHints` derived from them.

    T_lin(N)       = max(W / BW, 2 P N / (eta_g F))
    T_prefill(n,c) = T_lin(n) + F_att (n c + n^2/2) / (eta_a F) + (c+n) kv / BW + t_oh
    T_decode(B,K)  = T_lin(B) + K kv / BW + t_oh
    mixed step     = T_lin(n + B) + prefill attention + K kv / BW + t_oh
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from topasd.model import CostHints, TopasError, replace_known


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """Step-time coefficients (seconds) and engine settings of one testbed."""

    name: str
    description: str
    t_weights_s: float  # W / BW: reading the weights once per step
    t_lin_per_token_s: float  # 2P / (eta_g F): matmul time per token in a step
    t_attn_per_pair_s: float  # F_att / (eta_a F): prefill attention per (query, key)
    t_kv_read_per_token_s: float  # kv / BW: reading one context token's KV
    t_overhead_s: float  # t_oh: per-step launch/scheduling overhead
    kv_bytes_per_token: float  # mu
    swap_bytes_per_s: float  # B_swap: host link bandwidth
    budget_tokens: int  # B_t: KV pool in tokens
    chunk_tokens: int = 8192  # chunked-prefill budget per step
    max_prefill_tokens: int = 16384  # input tokens one SGLang admission round takes
    host_cache: bool = True  # evicted prefixes keep a host copy (HiCache-like)
    # without a host tier: an evicted ready prefix keeps its KV in free memory
    # (location HOST, loaded back at once) until a decision needs the room,
    # oldest first (vLLM's prefix cache, the blocks pinned by the backend)
    keep_evicted: bool = False
    # SGLang's optimistic admission (schedule_policy.py / scheduler.py)
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.098  # 0.7 x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    clip_max_new_tokens: int = 4096
    # SGLang 0.5.3 reserves a new request's whole max_new; new_token_ratio
    # discounts the remaining output of running requests only.
    mixed_chunk: bool = False  # SGLang's default: prefill steps run apart from decode

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise TopasError(f"profile {self.name!r}: {f.name} must be >= 0, got {value}")
        if self.budget_tokens <= 0 or self.chunk_tokens <= 0:
            raise TopasError(f"profile {self.name!r}: budget_tokens and chunk_tokens must be > 0")
        if self.swap_bytes_per_s <= 0:
            raise TopasError(f"profile {self.name!r}: swap_bytes_per_s must be > 0")

    @property
    def new_token_ratio_decay(self) -> float:
        return (self.init_new_token_ratio - self.min_new_token_ratio) / max(
            1, self.new_token_ratio_decay_steps
        )

    def t_lin(self, tokens: int) -> float:
        return max(self.t_weights_s, self.t_lin_per_token_s * tokens)

    def step_time(self, prefill_tokens: int, attn_pairs: float, decode_batch: int,
                  context_tokens: int) -> float:
        """One engine step: prefill chunks + one decode token per running request.

        `attn_pairs` is sum over prefill pieces of n*c + n^2/2; `context_tokens`
        is the KV read in the step (every decoding request's whole context plus
        the prefill pieces' context).
        """
        return (
            self.t_lin(prefill_tokens + decode_batch)
            + self.t_attn_per_pair_s * attn_pairs
            + self.t_kv_read_per_token_s * context_tokens
            + self.t_overhead_s
        )

    def t_prefill(self, n: int, cached: int = 0) -> float:
        """A lone prefill of n tokens on c cached tokens."""
        return self.step_time(n, n * cached + n * n / 2.0, 0, cached + n)

    def t_swap(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.swap_bytes_per_s

    def cost_hints(self) -> CostHints:
        """Profiled costs for policies: T_decode at batch 1, T_prefill ~ linear."""
        per_token = self.t_lin_per_token_s
        return CostHints(
            t_decode_s=self.t_lin(1) + self.t_overhead_s,
            prefill_s_per_token=per_token,
            prefill_base_s=self.t_overhead_s,
            kv_bytes_per_token=self.kv_bytes_per_token,
            swap_bytes_per_s=self.swap_bytes_per_s,
            weights_s=self.t_weights_s,
            lin_per_token_s=self.t_lin_per_token_s,
            kv_read_per_token_s=self.t_kv_read_per_token_s,
            overhead_s=self.t_overhead_s,
        )

    def with_overrides(self, **changes: object) -> HardwareProfile:
        return replace_known(self, "profile field(s)", **changes)


def _a100_qwen32b() -> HardwareProfile:
    """Qwen2.5-32B-Instruct bf16 on one A100 80GB (CALIBRATION.md), with SGLang
    0.5.3's admission and retraction as its code has them: a new request reserves
    input + max_new, running ones max_new x new_token_ratio; the ratio decays per
    decode step and restarts only when the engine idles; a retracted request
    keeps its output and re-prefills it."""
    flops = 312e12
    eta_g, eta_a = 0.70, 0.55
    bw = 1.5e12
    weights = 65.5e9
    matmul_params = 31.2e9 + 0.78e9
    f_att = 4 * 64 * 40 * 128
    kv = 2 * 64 * 8 * 128 * 2  # 262,144 B per token
    return HardwareProfile(
        name="qwen2.5-32b-a100",
        description="Qwen2.5-32B-Instruct bf16 on one A100 80GB, SGLang 0.5.3's admission "
        "and retraction (18k-token KV pool, 25 GB/s host link)",
        t_weights_s=weights / bw,
        t_lin_per_token_s=2 * matmul_params / (eta_g * flops),
        t_attn_per_pair_s=f_att / (eta_a * flops),
        t_kv_read_per_token_s=kv / bw,
        t_overhead_s=0.002,
        kv_bytes_per_token=kv,
        swap_bytes_per_s=25e9,
        budget_tokens=18_000,
        chunk_tokens=8192,
    )


def _small() -> HardwareProfile:
    """A tiny fast profile for tests: 4k-token pool, millisecond steps."""
    return HardwareProfile(
        name="small",
        description="a small test profile: 4,096-token pool, ~10 ms decode steps",
        t_weights_s=0.010,
        t_lin_per_token_s=20e-6,
        t_attn_per_pair_s=1e-9,
        t_kv_read_per_token_s=1e-7,
        t_overhead_s=0.001,
        kv_bytes_per_token=16_384,
        swap_bytes_per_s=1e9,
        budget_tokens=4096,
        chunk_tokens=1024,
    )


def _unit() -> HardwareProfile:
    """Fig. 2's abstract machine: every step 1 time unit, prefill free of extra
    cost, a prefix moves at 10 tokens per unit (`workflows.fig2.fig2_profile`
    sets the budget and a link that moves Fig. 2's prefixes in 1 unit)."""
    return HardwareProfile(
        name="unit",
        description="Fig. 2 units: 1 unit per step, prefixes move at 10 tokens per unit",
        t_weights_s=1.0,
        t_lin_per_token_s=0.0,
        t_attn_per_pair_s=0.0,
        t_kv_read_per_token_s=0.0,
        t_overhead_s=0.0,
        kv_bytes_per_token=1.0,
        swap_bytes_per_s=10.0,
        budget_tokens=100,
        chunk_tokens=1000,
    )


PROFILES: dict[str, HardwareProfile] = {
    p.name: p for p in (_a100_qwen32b(), _small(), _unit())
}
DEFAULT_PROFILE = "qwen2.5-32b-a100"


def get_profile(name: str) -> HardwareProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise TopasError(
            f"unknown hardware profile {name!r}; choose one of {sorted(PROFILES)}"
        ) from None
