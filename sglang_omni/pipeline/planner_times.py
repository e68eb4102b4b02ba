"""The measured times the generation planner plans with, each over a sliding window.

Every Reasoner turn and every generation that finished is a sample. A series keeps the longest
and the shortest of its samples of the last ``timeout_s``; once all of them have expired its
latest sample stands in, so a quiet spell does not forget what was measured.

A generation's time grows with its denoising steps (each step is one pass of the same model over
the same latents; encoding and decoding around them add a fixed cost). A generation whose step
count is known is also a sample of its modality's seconds per step, so a request asking for more
steps than were measured is planned at ``per-step x steps`` rather than at the time of the
shorter generations measured: with a non-negative fixed cost, ``t_j x s / s_j`` bounds the time
of ``s >= s_j`` steps from above. Fewer steps than measured are planned at the longest time, as
before (scaling down would drop the fixed cost).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field


class SlidingExtremes:
    """Longest and shortest of the samples of the last ``span`` seconds.

    Monotonic deques make ``add``, ``expire`` and reads O(1) amortised. Samples must be added in
    time order. Once every sample has expired the latest one stands in.
    """

    def __init__(self, span: float) -> None:
        self._span = span
        self._max: deque[tuple[float, float]] = deque()  # values strictly decreasing
        self._min: deque[tuple[float, float]] = deque()  # values strictly increasing
        self._latest: float | None = None

    def add(self, at: float, value: float) -> None:
        while self._max and self._max[-1][1] <= value:
            self._max.pop()
        self._max.append((at, value))
        while self._min and self._min[-1][1] >= value:
            self._min.pop()
        self._min.append((at, value))
        self._latest = value

    def expire(self, now: float) -> None:
        """Drop samples taken more than ``span`` seconds before ``now``."""
        cutoff = now - self._span
        for dq in (self._max, self._min):
            while dq and dq[0][0] < cutoff:
                dq.popleft()

    @property
    def longest(self) -> float | None:
        return self._max[0][1] if self._max else self._latest

    @property
    def shortest(self) -> float | None:
        return self._min[0][1] if self._min else self._latest


@dataclass(frozen=True)
class MeasuredTimes:
    """The times the plan uses, in seconds; None / absent where nothing was measured.

    ``longest_s``/``shortest_s`` are by modality, and ``step_s`` the longest seconds per
    denoising step by modality (of the generations whose step count is known);
    ``default_steps`` the steps a generation of a request that named none ran last, by
    modality (the engine's default): such a request is planned at that count. Not hashable (it
    holds mappings).
    """

    reasoner_s: float | None = None
    longest_s: Mapping[str, float] = field(default_factory=dict)
    shortest_s: Mapping[str, float] = field(default_factory=dict)
    step_s: Mapping[str, float] = field(default_factory=dict)
    default_steps: Mapping[str, int] = field(default_factory=dict)

    @property
    def generation_s(self) -> float | None:
        """The longest generation of any modality: what a generation not yet chosen may take."""
        return max(self.longest_s.values()) if self.longest_s else None

    def generation(self, steps: int | None = None) -> float:
        """What a generation not yet chosen, of ``steps`` steps (None: the engine's default,
        as last seen in ``default_steps``), may take: the longest of any modality at that step
        count.

        Only valid once a generation was measured (``generation_s`` is not None).
        """
        assert self.longest_s, "no generation measured yet"
        return max(self._at(m, steps) for m in self.longest_s)

    @property
    def reasoner(self) -> float:
        """The longest Reasoner turn, 0 before any was measured."""
        return self.reasoner_s or 0.0

    def longest(self, modality: str, steps: int | None = None) -> float:
        """The longest generation of ``modality`` at ``steps`` steps (None: the engine's
        default); of any modality if that one is unmeasured.

        Only valid once a generation was measured (``generation_s`` is not None).
        """
        if modality in self.longest_s:
            return self._at(modality, steps)
        return self.generation(steps)

    def _at(self, modality: str, steps: int | None) -> float:
        longest = self.longest_s[modality]
        per_step = self.step_s.get(modality)
        if steps is None:
            steps = self.default_steps.get(modality)
        if steps is None or per_step is None:
            return longest
        return max(longest, per_step * steps)

    def shortest(self, modality: str) -> float:
        """The shortest generation of ``modality``; 0 if unmeasured (nothing rules a fit out)."""
        return self.shortest_s.get(modality, 0.0)

    def is_longer_than(self, before: MeasuredTimes) -> bool:
        """Whether these times hold a longer time than ``before`` (a first measurement counts)."""
        if self.reasoner_s is not None and (before.reasoner_s is None
                                            or self.reasoner_s > before.reasoner_s):
            return True
        return any(m not in earlier or value > earlier[m]
                   for now, earlier in ((self.longest_s, before.longest_s),
                                        (self.step_s, before.step_s))
                   for m, value in now.items())
