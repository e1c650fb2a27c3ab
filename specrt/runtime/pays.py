"""What pays on this machine: the target's call cost by tokens fed (measured once per engine and call layout) and
what each drafter showed in the engine's earlier requests. Every speculative request's controllers
(runtime/adaptive.py) start from it instead of from guesses, and write back what they learned.

The calibration feeds dummy tokens after the cache's current contents and rolls them back (slots past the
cache's length are never read), interleaving the widths over a few rounds so that a slow moment of a shared
machine does not land on one width; the median per width is kept. It happens before the first token of an engine's
first speculative request, so on a slow target (a 9B on a CPU: a round of widths 1..5 takes 1.5 s) it keeps to
fewer rounds, as many as fit CALIBRATION_SECONDS (at least one): the loop goes on measuring every call it makes.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from specrt.runtime.adaptive import DrafterRecord

CALIBRATION_ROUNDS = 4  # timed calls per width (after one untimed round that warms every width up)
CALIBRATION_SECONDS = 2.0  # timed rounds beyond the first only while they fit this (a slow target's time to first token)


def measure_call_costs(target, widths: list[int], rounds: int = CALIBRATION_ROUNDS) -> dict[int, float]:
    """Seconds of a target call feeding w tokens, for each w in widths that fits the context after the cache's
    current length (target: a runtime.target_session.TargetSession; its cache is left as it was)."""
    base = target.length
    fits = [w for w in widths if base + target.padded_rows(w) <= target.spec.max_context]
    times: dict[int, list[float]] = {w: [] for w in fits}
    for r in range(rounds + 1):
        start = time.perf_counter()
        for w in fits:
            t = time.perf_counter()
            target.forward(np.zeros((1, w), dtype=np.int64))
            seconds = time.perf_counter() - t
            target.rollback(base)
            if r:
                times[w].append(seconds)
        if r == 0:  # the warm-up round says what a round costs
            rounds = max(1, min(rounds, int(CALIBRATION_SECONDS / max(time.perf_counter() - start, 1e-9))))
        elif r >= rounds:
            break
    return {w: statistics.median(ts) for w, ts in times.items()}


class PaysMemory:
    """An engine's knowledge of what pays: call costs per call layout (batch-invariant or not), and per drafter
    name its record from the latest request that ran it."""

    def __init__(self):
        self.call_costs: dict[bool, dict[int, float]] = {}
        self.drafters: dict[str, DrafterRecord] = {}

    def costs(self, target, layout: bool, widths: int) -> dict[int, float]:
        """The call costs for widths 1..widths (a copy), measuring those not measured yet in this layout."""
        table = self.call_costs.setdefault(layout, {})
        missing = [w for w in range(1, widths + 1) if w not in table]
        if missing:
            table.update(measure_call_costs(target, missing))
        return dict(table)
