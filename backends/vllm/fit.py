"""Fit the simulator's step-time model to measured vLLM steps.

The simulator prices a step as (`HardwareProfile.step_time`, weights term 0)

    dt = overhead + lin * (prefill_tokens + decode_batch)
         + attn * sum(n*c + n^2/2) + kv * context_tokens

`fit_step_costs` finds the four non-negative coefficients by least squares on
the `StepSample`s a `VllmBackend` records; `fitted_profile` puts them into the
profile the vLLM backend's runs are simulated with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import nnls

from backends.vllm.backend import StepSample
from backends.vllm.sizing import cpu_profile
from topasd.model import TopasError
from topasd.profiles import HardwareProfile


@dataclass(frozen=True, slots=True)
class StepFit:
    """Fitted step costs (seconds) and how well they explain the samples."""

    overhead: float
    lin: float
    attn: float
    kv: float
    samples: int
    dropped: int  # samples left out as outliers (bursts of other load)
    mean_step_s: float
    mean_abs_err_s: float  # per step
    total_err: float  # (sum predicted - sum measured) / sum measured

    def as_dict(self) -> dict[str, float]:
        return {"overhead": self.overhead, "lin": self.lin, "attn": self.attn, "kv": self.kv}

    def predict(self, s: StepSample) -> float:
        return (self.overhead + self.lin * (s.prefill_tokens + s.decode_batch)
                + self.attn * s.attn_pairs + self.kv * s.context_tokens)


def _features(samples: Sequence[StepSample]) -> np.ndarray:
    return np.array([[1.0, s.prefill_tokens + s.decode_batch, s.attn_pairs, s.context_tokens]
                     for s in samples], dtype=float)


def step_time(s: StepSample, measure: str = "wall") -> float:
    """A sample's measured time: `wall` (step_s) or `cpu` (engine thread CPU time)."""
    return s.cpu_s if measure == "cpu" else s.step_s


def fit_step_costs(samples: Sequence[StepSample], measure: str = "wall",
                   trim: float | None = 5.0) -> StepFit:
    """Non-negative least squares of measured step times on the step's shape.

    With `trim`, steps slower than the first fit by more than `trim` robust
    standard deviations (1.4826 x MAD of the residuals) are left out and the
    fit is redone: on a shared machine, other processes' bursts make runs of
    steps several times slower than their shape explains.
    """
    if len(samples) < 8:
        raise TopasError(f"need at least 8 measured steps to fit step costs, got {len(samples)}")
    x = _features(samples)
    y = np.array([step_time(s, measure) for s in samples], dtype=float)
    scale = np.maximum(x.max(axis=0), 1e-12)  # columns on one scale for the solver
    coef, _ = nnls(x / scale, y)
    keep = np.ones(len(y), dtype=bool)
    if trim is not None:
        resid = y - (x / scale) @ coef
        mid = np.median(resid)
        keep = resid <= mid + trim * 1.4826 * np.median(np.abs(resid - mid))
        coef, _ = nnls(x[keep] / scale, y[keep])
    coef = coef / scale
    pred = x[keep] @ coef
    yk = y[keep]
    return StepFit(overhead=float(coef[0]), lin=float(coef[1]), attn=float(coef[2]),
                   kv=float(coef[3]), samples=int(keep.sum()), dropped=int((~keep).sum()),
                   mean_step_s=float(yk.mean()), mean_abs_err_s=float(np.abs(pred - yk).mean()),
                   total_err=float((pred.sum() - yk.sum()) / yk.sum()))


def fitted_profile(fit: StepFit, budget_tokens: int, chunk_tokens: int,
                   model_config: Mapping[str, Any] | None = None) -> HardwareProfile:
    """The vLLM backend's CPU profile with `fit`'s step costs."""
    base = cpu_profile(budget_tokens, chunk_tokens, model_config)
    return replace(base, name="vllm-cpu-fitted",
                   description="step costs fitted to this machine's measured vLLM steps",
                   t_weights_s=0.0, t_lin_per_token_s=fit.lin, t_attn_per_pair_s=fit.attn,
                   t_kv_read_per_token_s=fit.kv, t_overhead_s=fit.overhead)
