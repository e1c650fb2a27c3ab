"""Prompt lookup decoding (Saxena, 2023; llama.cpp's and transformers' prompt-lookup mode), with an optional
datastore of earlier generations (as SuffixDecoding and REST draft from earlier outputs).

The longest suffix of the context (n from max_n down to min_n tokens) that occurred earlier is looked up,
most recent occurrence first, and the tokens that followed it become a chain draft. With `remember` > 0 the
drafter also keeps the contexts (prompt and answer) of its earlier generations, up to that many tokens, most
recent kept: a suffix of at least `history_min_n` tokens that the context lacks is looked up there (a single
token matches too much of a large store to be worth a draft).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specrt.runtime.drafter import Draft, Drafter


@dataclass
class NgramDrafter(Drafter):
    max_n: int = 3
    # a one-token match drafts too often on chat text (measured: docs/performance.md, "The adaptive draft length:
    # the default never makes decoding slower")
    min_n: int = 2
    name: str = "ngram"
    remember: int = 0  # tokens of earlier generations kept as a datastore (0: prompt lookup only)
    history_min_n: int = 2
    _store: "NgramStore | None" = field(default=None, repr=False)
    _last: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self):
        if self.remember > 0:
            self._store = NgramStore(self.remember, self.history_min_n, self.max_n)

    HISTORY_TOKENS = 1 << 16  # what "ngram:history" keeps of earlier generations

    def use_mode(self, mode: str) -> None:
        """"history": also draft from earlier generations (a datastore of HISTORY_TOKENS tokens)."""
        if mode != "history":
            raise ValueError(f"ngram has no mode {mode!r}")
        self.remember = self.HISTORY_TOKENS
        self.__post_init__()

    def reset(self, params=None, rng=None) -> None:
        """A new generation: the one before it (its last context seen) joins the datastore."""
        if self._store is not None and self._last:
            self._store.add(self._last)
        self._last = []

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        self._last = list(context) if self._store is not None else self._last
        if max_tokens < 1 or len(context) < self.min_n + 1:
            return None
        ctx = np.asarray(context, dtype=np.int64)
        for n in range(min(self.max_n, len(ctx) - 1), self.min_n - 1, -1):
            suffix = ctx[-n:]
            # windows over ctx[:-1] so that the match is followed by at least one token
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
            hits = np.nonzero((windows == suffix).all(axis=1))[0]
            if len(hits):
                start = int(hits[-1]) + n
                follow = ctx[start:start + max_tokens]
                if len(follow):
                    return Draft.chain(follow)
            if self._store is not None:
                follow = self._store.follow(tuple(int(t) for t in suffix), max_tokens)
                if follow:
                    return Draft.chain(np.asarray(follow, dtype=np.int64))
        return None


class NgramStore:
    """Earlier token sequences, newest last, with an index from every n-gram (min_n..max_n tokens) to the
    position after its latest occurrence."""

    def __init__(self, capacity: int, min_n: int, max_n: int):
        self.capacity, self.min_n, self.max_n = capacity, min_n, max_n
        self.sequences: list[list[int]] = []
        self.index: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (sequence number, position after)
        self.first = 0  # sequence number of sequences[0]
        self.size = 0  # tokens held, over all sequences

    def add(self, tokens: list[int]) -> None:
        tokens = [int(t) for t in tokens[-self.capacity:]]
        number = self.first + len(self.sequences)
        self.sequences.append(tokens)
        self.size += len(tokens)
        for n in range(self.min_n, self.max_n + 1):
            for end in range(n, len(tokens)):  # followed by at least one token
                self.index[tuple(tokens[end - n:end])] = (number, end)
        first = self.first
        while self.size > self.capacity:
            self.size -= len(self.sequences.pop(0))
            self.first += 1
        if self.first != first:  # n-grams whose latest occurrence left with the dropped sequences
            self.index = {k: v for k, v in self.index.items() if v[0] >= self.first}

    def follow(self, suffix: tuple[int, ...], max_tokens: int) -> list[int]:
        """The tokens after the latest earlier occurrence of suffix (at most max_tokens), or []."""
        if len(suffix) < self.min_n or len(suffix) > self.max_n:
            return []
        hit = self.index.get(suffix)
        if hit is None:
            return []
        seq = self.sequences[hit[0] - self.first]
        return seq[hit[1]:hit[1] + max_tokens]
