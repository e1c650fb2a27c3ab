"""Synthetic acceptance for `specrt bench --synth-len L`: speculation's speed at a stated acceptance, measured.

A random-weight real-size model's drafters accept nothing, and a real model's acceptance varies by prompt; to compare
engines at equal acceptance, llama-server has `--spec-synth-len L`: its draft model drafts as usual (its cost paid),
then each draft token is accepted at random, the i-th given the ones before it with probability p, p chosen so that
a target call yields L tokens on average (the target's own included). The replay drafter here is specrt's twin: it
runs the bundle's drafter for every draft (its real cost), then proposes plain decoding's own greedy continuation
with each token kept right with probability p and made wrong otherwise, so the target accepts a geometric prefix at
the same rates, and the output stays plain decoding's. Seeded: two runs draft alike.
"""

from __future__ import annotations

import numpy as np

from specrt.runtime.drafter import Draft, Drafter

DEFAULT_DRAFT_TOKENS = 3  # llama-server's --spec-draft-n-max default


def synth_acceptance(length: float, n_max: int) -> float:
    """The per-token acceptance p with 1 + p + p^2 + ... + p^n_max = length (llama-server's --spec-synth-len: the
    mean tokens a call yields with n_max draft tokens, the target's own included)."""
    if n_max < 1:
        raise ValueError("synthetic acceptance needs at least one draft token")
    if not 1.0 <= length <= n_max + 1:
        raise ValueError(f"a synthetic acceptance length is within [1, {n_max + 1}] for {n_max} draft tokens")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** j for j in range(1, n_max + 1)) < length - 1.0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class ReplayDrafter(Drafter):
    """Plain decoding's greedy continuation `greedy` (after a prompt of `prompt_len` tokens), each draft token right
    with probability `acceptance` (a wrong one is the right one + 1); `inner` (a real drafter) is run first for
    every draft, so its cost is paid and its caches stay in step."""

    def __init__(self, prompt_len: int, greedy: list[int], vocab: int, acceptance: float, inner: Drafter | None = None,
                 seed: int = 0):
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError("acceptance is a probability")
        self.prompt_len, self.greedy, self.vocab, self.acceptance = prompt_len, list(greedy), vocab, acceptance
        self.inner, self.seed = inner, seed
        self.rng = np.random.default_rng(seed)
        self.name = f"replay-{acceptance:.0%}" + (f"({inner.name})" if inner is not None else "")
        self.max_draft = inner.max_draft if inner is not None else None
        self.reads_hidden_states = inner is not None and inner.reads_hidden_states

    def bind(self, target) -> None:
        if self.inner is not None:
            self.inner.bind(target)

    def use_costs(self, seconds) -> None:
        if self.inner is not None:
            self.inner.use_costs(seconds)

    def reset(self, params=None, rng=None) -> None:
        self.rng = np.random.default_rng(self.seed)
        if self.inner is not None:
            self.inner.reset(params, rng)

    def prefill(self, prompt: list[int]) -> None:
        if self.inner is not None:
            self.inner.prefill(prompt)

    def backlog(self, context: list[int]) -> int:
        return self.inner.backlog(context) if self.inner is not None else 0

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        done = len(context) - self.prompt_len  # output tokens so far (the pending one included)
        truth = self.greedy[done:done + max_tokens]
        if not truth:
            return None
        if self.inner is not None:  # pay the real drafter's cost (and keep its caches in step)
            real = self.inner.propose(context, len(truth))
            if real is None:
                return None
            truth = truth[:len(real)]
        right = self.rng.random(len(truth)) < self.acceptance
        return Draft.chain([t if ok else (t + 1) % self.vocab for t, ok in zip(truth, right)])


class ReplayContestant:
    """A `specrt bench` row at synthetic acceptance length `length`: `draft_tokens` drafts a call (fixed, as
    llama-server's --spec-draft-n-max), `inner` (the bundle's drafter, named `inner_name`) paying the drafting cost.
    Plain decoding's output for each prompt is generated once, untimed, to replay."""

    system = "specrt"

    def __init__(self, engine, length: float, draft_tokens: int, inner: Drafter, inner_name: str, precision: str,
                 batch_invariant: bool):
        from specrt import __version__

        self.engine, self.length, self.draft_tokens, self.inner = engine, length, draft_tokens, inner
        self.acceptance = synth_acceptance(length, draft_tokens)
        self.drafter = f"synth-{length:g}"
        self.precision, self.batch_invariant, self.version = precision, batch_invariant, __version__
        self.key = ("specrt", self.drafter)
        self.label = f"{self.drafter} ({inner_name})"
        self.records: dict = {}
        self._plain: dict = {}

    def generate(self, prompt: str, ids: list[int], params):
        from specrt.app.bench_contestants import Sample

        engine = self.engine
        engine.batch_invariant = self.batch_invariant
        key = (tuple(ids), params.max_new_tokens, params.seed)
        if key not in self._plain:
            engine.reset()
            self._plain[key] = engine.generate(prompt, params, drafter=None).wait().token_ids
        # each prompt its own draws (bench seeds each prompt apart): one random sequence would decide every prompt
        drafter = ReplayDrafter(len(ids), self._plain[key], engine.manifest.vocab_size, self.acceptance,
                                inner=self.inner, seed=params.seed or 0)
        engine.reset()
        engine.pays.drafters = self.records
        saved = engine.draft_length
        engine.draft_length = self.draft_tokens
        try:
            result = engine.generate(prompt, params, drafter=drafter).wait()
        finally:
            engine.draft_length = saved
        return Sample(result.token_ids, result.stats.tokens_per_second, result.stats)
