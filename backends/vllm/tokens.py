"""Synthetic prompts: a trace's token counts as token ids.

An agent's prefix is a fixed id sequence (the same for every request of that
agent, so vLLM's prefix cache shares it); then come the shared task context
segments the request names, each a fixed id sequence of its copy's key (so
the requests holding a copy share its blocks, as the simulator shares the
copy); each request appends its own fresh ids. Ids are drawn from a seeded
generator, never below `RESERVED_IDS` (special tokens), so a run is
reproducible and prompts never collide.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np

from topasd.model import Request, Segment

RESERVED_IDS = 16  # ids below this (bos, eos, pad, ...) are never drawn
_PREFIX, _FRESH, _SEGMENT = 1, 2, 3


class SyntheticTokens:
    """Token ids for agent prefixes and requests of one run."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        if vocab_size <= RESERVED_IDS + 1:
            raise ValueError(f"vocab_size must exceed {RESERVED_IDS + 1}, got {vocab_size}")
        self.vocab_size = vocab_size
        self.seed = seed
        self._prefixes: dict[str, list[int]] = {}
        self._segments: dict[str, list[int]] = {}

    def prefix(self, agent: str, n: int) -> list[int]:
        """The agent's fixed prefix of `n` ids (stable across calls)."""
        ids = self._prefixes.get(agent)
        if ids is None or len(ids) != n:
            ids = self._draw((self.seed, _PREFIX, zlib.crc32(agent.encode())), n)
            self._prefixes[agent] = ids
        return ids

    def segment(self, seg: Segment) -> list[int]:
        """The ids of a shared copy (`Segment.key`): the same for every holder."""
        ids = self._segments.get(seg.key)
        if ids is None or len(ids) != seg.tokens:
            digest = int.from_bytes(hashlib.sha256(seg.key.encode()).digest()[:8], "big")
            ids = self._draw((self.seed, _SEGMENT, digest), seg.tokens)
            self._segments[seg.key] = ids
        return ids

    def fresh(self, request_id: int, n: int) -> list[int]:
        """`n` ids owned by one request (its dynamic input)."""
        return self._draw((self.seed, _FRESH, request_id), n)

    def prompt(self, req: Request) -> list[int]:
        """Prefix + shared segments + fresh input; at least one fresh id, so the
        prompt's last token (which vLLM always recomputes) is never shared."""
        ids = self.prefix(req.agent, req.prefix_tokens)
        for seg in req.shared:
            ids = ids + self.segment(seg)
        return ids + self.fresh(req.id, max(1, req.own_input))

    def _draw(self, key: tuple[int, int, int], n: int) -> list[int]:
        rng = np.random.default_rng(list(key))
        return rng.integers(RESERVED_IDS, self.vocab_size, size=n).tolist()
