"""Token producers for the engine's decode loop: plain decoding and draft-verify (speculative) decoding.

Both keep a pending token: chosen (sampled or verified) but not yet fed to the target. A plain step feeds
it and samples one token. A speculative step asks the drafter for a draft continuing the context, feeds
[pending, *draft] in one target call (tree drafts with their depths as positions and an attention bias
that hides non-ancestors), lets the verifier accept a path and pick the next token, then commits the
accepted path in the KV cache: a chain by rolling the length back, a tree by one gather of the path's
slots into place and then the roll-back. Nothing is allocated for the cache per step. How long a draft to
ask for (down to none) is the adaptive controller's choice (runtime/adaptive.py); with several drafters
(drafters/mixed.py) each has its controller, and the step asks them in order of expected tokens per second.
The controllers start from the engine's calibrated call costs and its drafters' records (runtime/pays.py). A step
that drafts nothing is exactly a plain step: the same one-token target call PlainStepper makes. Under an output
constraint the grammar drafts too: the tokens it forces next lead the draft (the drafter continues after them), at
no drafting cost; constrained decoding with no drafter runs GrammarOnly, which drafts only those.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from specrt.runtime.drafter import Draft, Drafter
from specrt.runtime.adaptive import DraftController
from specrt.runtime.constraint import masked
from specrt.runtime.decode_target import DecodeTarget
from specrt.runtime.sampling import Sampler, SamplingParams
from specrt.runtime.verify import verify, verify_on_device

PROBE_BACKLOG = 48  # context tokens a drafter may have to catch up on for a probe (beyond: postponed)
FORCED_MAX = 16  # grammar-forced tokens one verification takes at most


@dataclass
class StepStats:
    target_calls: int = 0  # decode-phase target calls (prefill excluded)
    accepted_by_position: list[int] = field(default_factory=list)  # accepted count at draft depth 1, 2, ...
    drafted_by_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    drafts_by_drafter: dict[str, int] = field(default_factory=dict)  # verified drafts per member drafter
    forced_drafted: int = 0  # tokens the grammar forced at the head of a draft
    forced_accepted: int = 0  # of those, accepted by the target


class PlainStepper:
    """One target call per token (each chosen among the tokens the output constraint allows, if there is one)."""

    name = "none"

    def __init__(self, target: DecodeTarget, params: SamplingParams, constraint=None):
        self.target, self.sampler, self.stats = target, Sampler(params), StepStats()
        self.constraint = constraint  # runtime/constraint.OutputConstraint, or None
        self.pending: int | None = None

    def _choose(self, logits: np.ndarray) -> int:  # logits [V]
        if self.constraint is None:
            return self.sampler(logits)
        token = self.sampler(self.constraint.mask(logits))
        self.constraint.consume([token])
        return token

    def first(self, logits: np.ndarray) -> list[int]:  # logits [V] after the prompt
        self.pending = self._choose(logits)
        return [self.pending]

    def step(self, budget: int) -> list[int]:
        t = time.perf_counter()
        logits = self.target.feed([self.pending])[-1]
        self.last_call_seconds = time.perf_counter() - t
        self.stats.verify_seconds += self.last_call_seconds
        self.stats.target_calls += 1
        self.pending = self._choose(logits)
        return [self.pending]

    def finish(self) -> None:
        """The generation ended (nothing to keep for plain decoding)."""


def tree_bias(draft: Draft, past: int) -> np.ndarray:
    """Additive bias [1, 1, n + 1, past + n + 1] for [pending, *draft]: each token sees the past, the pending
    token, its ancestors and itself."""
    n = len(draft)
    bias = np.full((n + 1, n + 1), -np.inf, dtype=np.float32)
    bias[:, 0] = 0.0
    for i, p in enumerate(draft.parents.tolist()):
        row = i + 1
        bias[row, row] = 0.0
        while p >= 0:
            bias[row, p + 1] = 0.0
            p = int(draft.parents[p])
    full = np.zeros((1, 1, n + 1, past + n + 1), dtype=np.float32)
    full[0, 0, :, past:] = bias
    return full


class GrammarOnly(Drafter):
    """Constrained decoding with no drafter: nothing of its own is proposed, so each step's draft is what the
    grammar forces (SpeculativeStepper), or the step is plain."""

    name = "grammar"

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        return None


def _one_hot(tokens: list[int], width: int) -> np.ndarray:
    """[n, width]: the draft distribution of tokens proposed with certainty (the grammar's forced tokens)."""
    rows = np.zeros((len(tokens), width), dtype=np.float32)
    rows[np.arange(len(tokens)), tokens] = 1.0
    return rows


class SpeculativeStepper(PlainStepper):
    """Draft (as long as the adaptive controller says pays), verify in one target call, commit the path."""

    def __init__(self, target: DecodeTarget, params: SamplingParams, drafter: Drafter, max_draft: int = 4,
                 adaptive: bool = True, constraint=None):
        super().__init__(target, params, constraint)
        self.drafter, self.params, self.max_draft = drafter, params, max_draft
        # tokens the grammar forces lead the draft (none without a constraint, or with grammar drafting off)
        self.forced_max = min(FORCED_MAX, target.draft_limit or FORCED_MAX) if constraint is not None \
            and target.grammar_drafts else 0
        self.members = drafter.members  # a mix's members, else the drafter itself
        # the target's call costs, calibrated on this machine: one table for every member (runtime/pays.py)
        shared_costs = target.call_costs(max_draft + 1) if adaptive else {}
        self.controllers = [DraftController(max_draft, cost=shared_costs, per_call=m.block_drafter)
                            for m in self.members] if adaptive else []
        for member, controller in zip(self.members, self.controllers):
            controller.start_from(target.drafter_records.get(member.name))  # what it showed in earlier requests
        self.controller = self.controllers[0] if adaptive else None
        self.name = drafter.name
        for member, controller in zip(self.members, self.controllers or [None] * len(self.members)):
            if member.reads_hidden_states:
                member.bind(target.view())
            # block drafters cut their draft where verification stops paying
            member.use_costs(controller.seconds if controller else None)
        drafter.reset(params, self.sampler.rng)

    def finish(self) -> None:
        """The generation ended: each member's record becomes the next request's starting point."""
        for member, controller in zip(self.members, self.controllers):
            self.target.drafter_records[member.name] = controller.record()

    def _plain(self, budget: int) -> list[int]:
        out = super().step(budget)
        if self.controller:
            self.controller.observe_call(1, self.last_call_seconds)
        return out

    def _context(self) -> list[int]:
        """Prompt + output so far, ending with the pending token (what drafters continue)."""
        return self.target.context() + [self.pending]

    def _plans(self, budget: int, context=None) -> list[tuple[int, int]]:
        """(member, draft length) to ask for, most promising first; empty: decode plainly. A member that must
        first catch up on context (a draft model after another member's stretch) is charged for it this step.
        context: a callable returning the context (built only if needed)."""
        context = context or self._context
        if not self.controllers:
            k = min(self.max_draft, budget - 1)
            return [(i, k) for i in range(len(self.members))] if k >= 1 else []
        chosen = []
        for i, c in enumerate(self.controllers):
            overhead = c.catchup_cost * self.members[i].backlog(context()) if c.catchup_cost else 0.0
            if (k := c.choose(budget, overhead)) >= 1:
                chosen.append((c.rate(k, overhead), i, k))
        return [(i, k) for _, i, k in sorted(chosen, key=lambda p: -p[0])]

    def _propose(self, budget: int, forced: list[int]):
        """(member index, draft, seconds that member spent drafting, context tokens it caught up on) or None when
        no member drafts; the draft continues the grammar's forced tokens. A probe (a draft the controller asks
        for only to see whether acceptance changed) is postponed while the member would first have to read more
        than PROBE_BACKLOG tokens (a head that has not seen a long prompt)."""
        built: list[list[int]] = []

        def context() -> list[int]:  # built once, and only when some member needs it
            if not built:
                built.append(self._context() + forced)
            return built[0]

        for i, k in self._plans(budget, context):
            member = self.members[i]
            behind = member.backlog(context())
            controller = self.controllers[i] if self.controllers else None
            if controller is not None and controller.probing:
                if behind > PROBE_BACKLOG:
                    continue
                controller.probed()
            t = time.perf_counter()
            draft = member.propose(context(), k)
            if draft is not None and len(draft):
                return i, draft, time.perf_counter() - t, behind
        return None

    def _with_forced(self, forced: list[int], proposal):
        """The step's draft: the grammar's forced tokens, then the member's chain (a tree is dropped after forced
        tokens). Returns (member index or None, draft, seconds drafting, backlog read) or None: nothing drafted."""
        if not forced:
            return proposal
        if proposal is None or not proposal[1].is_chain():
            return None, Draft.chain(forced), 0.0, 0
        member, draft, drafting, behind = proposal
        probs = None if draft.probs is None else np.concatenate([_one_hot(forced, draft.probs.shape[1]), draft.probs])
        draft = Draft.chain(np.concatenate([np.asarray(forced, np.int64), draft.tokens]), probs)
        limit = self.target.draft_limit
        if limit and len(draft) > limit:  # a recurrent target replays at most its capture capacity
            draft = Draft.chain(draft.tokens[:limit], None if probs is None else probs[:limit])
        return member, draft, drafting, behind

    def step(self, budget: int) -> list[int]:
        t0 = time.perf_counter()
        forced = self.constraint.forced(min(self.forced_max, budget - 1)) if self.forced_max else []
        proposal = self._with_forced(forced, self._propose(budget - len(forced), forced))
        t1 = time.perf_counter()
        self.stats.draft_seconds += t1 - t0
        if proposal is None:
            return self._plain(budget)
        member, draft, drafting, behind = proposal
        masks = None
        if self.constraint is not None:  # cut the draft where the grammar forbids it; a tree is not walked
            kept, masks = self.constraint.walk(draft.tokens) if draft.is_chain() else (0, None)
            if kept == 0:
                return self._plain(budget)
            if kept < len(draft):
                draft = Draft.chain(draft.tokens[:kept], None if draft.probs is None else draft.probs[:kept])
        n_forced = min(len(forced), len(draft))
        base = self.target.length
        tokens = [self.pending, *draft.tokens.tolist()]
        depths = draft.depths()
        on_device = self.target.device_verify
        if draft.is_chain():
            logits = self.target.feed(tokens, device_logits=on_device)
        else:
            positions = base + np.concatenate([[0], depths])[None]
            logits = self.target.feed(tokens, position_ids=positions, attention_bias=tree_bias(draft, base),
                                      device_logits=on_device)
        if masks is not None:  # every position's logits as the grammar allows them after the draft before it
            logits = masked(logits, np.stack(masks))
        t2 = time.perf_counter()
        verdict = (verify_on_device if on_device else verify)(draft, logits, self.params, self.sampler.rng)
        self.stats.verify_seconds += time.perf_counter() - t1
        self.stats.target_calls += 1
        accepted = len(verdict.accepted)
        self.stats.forced_drafted += n_forced
        self.stats.forced_accepted += min(accepted, n_forced)
        own = len(draft) - n_forced  # the member's tokens after the forced ones (its depth: a tree has no forced)
        depth = int(depths.max()) - n_forced
        if own:
            name = self.members[member].name
            self.stats.drafts_by_drafter[name] = self.stats.drafts_by_drafter.get(name, 0) + 1
            self._count(depth, max(0, accepted - n_forced))
        t3 = time.perf_counter()
        self.target.commit(base, verdict.accepted, draft)
        # keeping the accepted path is part of the call's cost (a tree's KV gather; a recurrent target's replay)
        committing = time.perf_counter() - t3
        self.stats.verify_seconds += committing
        if self.controllers:
            controller = self.controllers[member if own else 0]
            controller.observe_call(len(tokens), t2 - t1 + committing)
            if own:
                catchup = self.members[member].catchup_seconds
                controller.observe_catchup(behind, catchup)
                controller.observe_draft(depth, max(0, accepted - n_forced), drafting - catchup, own)
        self.pending = verdict.next_token
        out = [int(draft.tokens[i]) for i in verdict.accepted] + [verdict.next_token]
        if self.constraint is not None:
            self.constraint.consume(out)
        return out

    def _count(self, depth: int, accepted: int) -> None:
        """Per draft depth: how many steps drafted that deep, and how many accepted that far."""
        while len(self.stats.drafted_by_position) < depth:
            self.stats.drafted_by_position.append(0)
            self.stats.accepted_by_position.append(0)
        for d in range(depth):
            self.stats.drafted_by_position[d] += 1
        for d in range(accepted):
            self.stats.accepted_by_position[d] += 1
