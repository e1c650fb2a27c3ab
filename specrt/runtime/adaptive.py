"""Adaptive draft length: pick the draft length that maximizes expected tokens per second, or none.

Per generation the controller keeps (a) the measured seconds of a target call by number of tokens fed (an
exponential moving average per count, seeded by the plain-step time and a prior slope until measured, read through a
fit that never falls as calls grow) and (b) the acceptance rate at each draft depth given that the previous depth
was accepted: the decayed counts of this request's drafts at that depth over a prior worth PRIOR_WEIGHT observations
(decaying with them), the prior being the drafter's record from earlier requests, or with none PRIOR_ACCEPT at the
first depth and the estimate at the depth before it at each deeper one (a depth not yet drafted is expected to do as
the one before it: a drafter right 95 % of the time at depth 1 and 2 is tried at depth 3, not held at a guessed
60 %). For a draft of k tokens the expected output of one call is 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens; the
controller chooses k in 0..max_draft maximizing that over cost(k + 1) (plus the drafting time: per token for a
drafter that makes one call per token, per call for a block drafter that drafts any length in one call), guessing
unmeasured costs optimistically so that they get measured, and drafts one token more than that where the next
depth's estimate is unsure enough that it might pay (one_more_might_pay). k = 0 is plain decoding; every
`probe_every` plain steps it drafts one token again, so acceptance that improves (a repetitive stretch for n-gram
lookup) is noticed; each probe that finds the drafter still not paying doubles that interval (up to
`PROBE_MAX`), so a drafter that never pays on this machine costs ever fewer probes; the interval starts again
from PROBE_EVERY only after SUSTAINED steps in a row that chose to draft (a lucky probe that turns drafting on
for a step or two does not).

What pays on this machine carries over between requests (runtime/pays.py): a controller starts from the
target's calibrated call costs and from what its drafter showed in the engine's earlier requests (acceptance by
depth and drafting cost, as a prior worth PRIOR_WEIGHT observations), not from a guess.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

EMA = 0.3  # for call costs
DRAFT_WINDOW = 5  # drafting cost: the median of the latest drafts (the first, a draft model's first call of a shape,
#                   took 1.6x the others in one trace: an average carried it for a dozen steps)
DECAY = 0.9  # acceptance: each observation weighs 0.9x the next one (an effective window of ~10 drafts)
WINDOW = 1 / (1 - DECAY)  # the most observations an estimate stands on
PRIOR_ACCEPT, PRIOR_WEIGHT = 0.6, 2.0  # optimistic prior worth two observations: try speculation first
PRIOR_SLOPE = 0.1  # before any measurement: each extra token fed costs a tenth of a one-token call
PROBE_EVERY, PROBE_MAX = 16, 512  # plain steps between probes: the first interval, and where doubling stops
SUSTAINED = 8  # steps in a row that choose to draft before the probe interval starts again from PROBE_EVERY
MARGIN = 1.02  # a longer draft is chosen only where it is expected to pay this much more
PROBE_SHARE = 0.02  # a probe that finds nothing may cost at most this share of the plain steps before it


@dataclass
class DraftController:
    max_draft: int
    probe_every: int = PROBE_EVERY
    cost: dict[int, float] = field(default_factory=dict)  # tokens fed -> seconds per call
    hits: list[float] = field(default_factory=list)  # depth d (0-based): decayed count of accepts given d-1 accepted
    tries: list[float] = field(default_factory=list)  # depth d: decayed count of drafts that reached depth d
    # depth d: the observations behind the prior (a record's own; PRIOR_WEIGHT for a guess): how sure the estimate
    # is, for exploring (one_more_might_pay), not how much the prior weighs in it (PRIOR_WEIGHT)
    prior_evidence: list[float] = field(default_factory=list)
    prior: list[float] | None = None  # acceptance by depth from the drafter's record; None: inherited by depth
    draft_cost: float = 0.0  # seconds of drafting per drafted token (per call when per_call): median of recent drafts
    recent_draft_costs: list[float] = field(default_factory=list)  # the latest DRAFT_WINDOW of them
    # seconds per context token a drafter reads before it can draft (a draft model after a stretch that another
    # member drafted or that was decoded plainly): charged to a step as overhead = backlog x catchup_cost
    catchup_cost: float = 0.0
    per_call: bool = False  # a block drafter (DFlash): one call costs the same for any draft length
    plain_streak: int = 0
    paying_streak: int = 0  # steps in a row that chose to draft
    probing: bool = False  # the last choose() asked for a probe

    def __post_init__(self):
        self.hits, self.tries = [0.0] * self.max_draft, [0.0] * self.max_draft
        self.prior_evidence = [PRIOR_WEIGHT] * self.max_draft

    def start_from(self, record: "DrafterRecord | None") -> None:
        """Take a drafter's record of earlier requests as the prior: its acceptance by depth (worth PRIOR_WEIGHT
        observations, so this request's own drafts soon outweigh it), its drafting cost and its probe interval."""
        if record is None:
            return
        self.prior = list(record.accept[:self.max_draft])
        evidence = record.evidence if record.evidence is not None else [WINDOW] * len(self.prior)
        self.prior_evidence[:len(evidence)] = evidence[:self.max_draft]
        self.draft_cost, self.catchup_cost = record.draft_cost, record.catchup_cost
        self.recent_draft_costs = [record.draft_cost] if record.draft_cost else []
        self.probe_every, self.plain_streak = record.probe_every, record.plain_streak

    def record(self) -> "DrafterRecord":
        """What this controller learned, for the next request's prior."""
        evidence = [min(WINDOW, self.tries[d] + self.prior_evidence[d] * self.prior_share(d))
                    for d in range(self.max_draft)]
        return DrafterRecord(self.accept, self.draft_cost, self.probe_every, self.plain_streak, self.catchup_cost,
                             evidence)

    @property
    def accept(self) -> list[float]:
        """P(draft token at depth d accepted | depth d - 1 accepted), per depth."""
        out, before = [], PRIOR_ACCEPT
        for d in range(self.max_draft):
            base = self.prior[d] if self.prior is not None and d < len(self.prior) else before
            w = PRIOR_WEIGHT * self.prior_share(d)
            before = (self.hits[d] + w * base) / (self.tries[d] + w)
            out.append(before)
        return out

    def prior_share(self, d: int) -> float:
        """How much of the prior at depth d still weighs: each of this request's drafts that reached d decays it by
        DECAY, as it decays the drafts before it, so after n of them DECAY^n = 1 - tries[d] / WINDOW."""
        return 1.0 - self.tries[d] / WINDOW

    def seconds(self, fed: int) -> float:
        """Cost of a call feeding `fed` tokens, read from the measured costs fitted to a curve that never falls as
        calls grow (a wider call costs at least a narrower one: noise cannot make drafting look free, and a slow
        moment measured at one width is pooled with its neighbours rather than raising every wider call to it): the
        fitted cost of the widest measured call of at most `fed` tokens. Unmeasured counts are so guessed
        optimistically (or from the prior slope), so that longer drafts get tried and measured."""
        if not self.cost:  # nothing measured yet: relative units from the prior slope
            return 1.0 + PRIOR_SLOPE * (fed - 1)
        widths = sorted(self.cost)
        fitted = non_decreasing([self.cost[n] for n in widths])
        below = [c for n, c in zip(widths, fitted) if n <= fed]
        return below[-1] if below else fitted[0]  # a smaller call costs at most the cheapest measured one

    def expected_tokens(self, k: int, accept: list[float] | None = None) -> float:
        total, reach = 1.0, 1.0
        for a in (accept or self.accept)[:k]:
            reach *= a
            total += reach
        return total

    def rate(self, k: int, overhead: float = 0.0, accept: list[float] | None = None) -> float:
        """Expected tokens per second of a step drafting k tokens (k = 0: a plain step); overhead: seconds the
        drafter spends before drafting this step (catching up on context); accept: other estimates by depth."""
        drafting = 0.0 if k == 0 else overhead + (self.draft_cost if self.per_call else self.draft_cost * k)
        return self.expected_tokens(k, accept) / (self.seconds(k + 1) + drafting)

    def choose(self, budget: int, overhead: float = 0.0) -> int:
        """Draft length for the next step (0: plain decoding); overhead as for rate()."""
        limit = max(0, min(self.max_draft, budget - 1))
        best, best_rate = 0, self.rate(0)
        for k in range(1, limit + 1):
            rate = self.rate(k, overhead)
            if rate > best_rate * MARGIN:  # a draft must pay for itself by a margin
                best, best_rate = k, rate
        if best < limit and self.one_more_might_pay(best, overhead, best_rate):
            best += 1
            if best == 1:  # trying again, not a step that pays: the probe interval stays where it is
                self.plain_streak = self.paying_streak = 0
                self.probing = False
                return 1
        if best == 0 and limit > 0:
            self.paying_streak = 0
            self.plain_streak += 1
            if self.plain_streak >= self.probe_due(overhead):
                self.probing = True  # the loop may still postpone it (runtime/speculative.py: a long backlog)
                return 1
        elif best > 0:
            self.plain_streak = 0
            self.paying_streak += 1
            if self.paying_streak >= SUSTAINED:
                self.probe_every = PROBE_EVERY
        self.probing = False
        return best

    def one_more_might_pay(self, k: int, overhead: float, k_rate: float) -> bool:
        """Whether a draft of k + 1 tokens would pay over k at an acceptance at depth k + 1 one standard error above
        its estimate (the decayed counts of this request's drafts there and the prior's evidence). A few rejections
        in a row pull an estimate from a handful of drafts below break-even (three at 50 %: one request in eight);
        deciding on the estimate alone would then hold the drafter at the depths it drafts, where it never sees
        that it was unlucky (at depth 1: plain decoding and probes that grow rarer), in this request and, through
        its record, the next. A record's estimate is as sure as the drafts behind it (DrafterRecord.evidence)."""
        accept = self.accept
        a = accept[k]
        sure = self.tries[k] + self.prior_evidence[k] * self.prior_share(k)  # observations behind the estimate
        accept[k] = min(1.0, a + math.sqrt(a * (1 - a) / sure))
        return self.rate(k + 1, overhead, accept) > k_rate * MARGIN

    def probe_due(self, overhead: float = 0.0) -> int:
        """Plain steps in a row after which to probe: the doubling interval, or more where a probe that finds
        nothing costs over PROBE_SHARE of the steps before it (capped at PROBE_MAX)."""
        if not self.cost:
            return self.probe_every
        plain = self.seconds(1)
        wasted = self.seconds(2) + overhead + self.draft_cost - plain  # a failed one-token draft beyond a plain step
        floor = math.ceil(wasted / plain / PROBE_SHARE) if plain > 0 and wasted > 0 else 0
        return max(self.probe_every, min(floor, PROBE_MAX))

    def probed(self) -> None:
        """The probe choose() asked for was drafted: the next one waits twice as long (reset if this one shows
        that drafting pays)."""
        self.plain_streak, self.probing = 0, False
        self.probe_every = min(2 * self.probe_every, PROBE_MAX)

    def observe_call(self, fed: int, seconds: float) -> None:
        old = self.cost.get(fed)
        self.cost[fed] = seconds if old is None else (1 - EMA) * old + EMA * seconds

    def observe_catchup(self, tokens: int, seconds: float) -> None:
        """A propose read `tokens` context tokens it had not seen, in `seconds` (0: it reported none)."""
        if tokens > 0 and seconds > 0:
            unit = seconds / tokens
            self.catchup_cost = unit if self.catchup_cost == 0 else (1 - EMA) * self.catchup_cost + EMA * unit

    def observe_draft(self, drafted_depth: int, accepted: int, seconds: float, drafted: int) -> None:
        for d in range(min(drafted_depth, accepted + 1)):  # depths reached: accepted ones and the first rejected
            self.hits[d] = DECAY * self.hits[d] + (1.0 if d < accepted else 0.0)
            self.tries[d] = DECAY * self.tries[d] + 1.0
        if drafted:
            unit = seconds if self.per_call else seconds / drafted
            self.recent_draft_costs = (self.recent_draft_costs + [unit])[-DRAFT_WINDOW:]
            self.draft_cost = statistics.median(self.recent_draft_costs)


def non_decreasing(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to values in least squares (pool adjacent violators: a run that falls is
    replaced by its mean)."""
    blocks: list[list[float]] = []  # [sum, count] of pooled runs
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


@dataclass(frozen=True)
class DrafterRecord:
    """What one drafter showed in a request: acceptance by depth, drafting cost (seconds per drafted token, or per
    call for a block drafter), the probe interval it had reached, the plain steps since its last draft (so that
    short requests, each fewer steps than the interval, still get probes), its catch-up cost per token, and the
    observations behind each depth's estimate (decayed, at most WINDOW; None: a full window)."""

    accept: list[float]
    draft_cost: float
    probe_every: int = PROBE_EVERY
    plain_streak: int = 0
    catchup_cost: float = 0.0
    evidence: list[float] | None = None
