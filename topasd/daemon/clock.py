"""The paced engine's clock: virtual time follows the wall clock."""

from __future__ import annotations

import time


class PacedClock:
    """Virtual time of the paced engine: (wall - wall0) x speed (None: unpaced)."""

    def __init__(self, speed: float | None) -> None:
        self.speed = speed
        self.wall0 = time.monotonic()

    def now(self) -> float:
        assert self.speed is not None
        return (time.monotonic() - self.wall0) * self.speed
