"""Prompt lookup decoding (Saxena, 2023; llama.cpp's and transformers' prompt-lookup mode), with an optional
datastore of earlier generations (as SuffixDecoding and REST draft from earlier outputs, and llama.cpp's default
speculation keeps an n-gram pool across requests).

The longest suffix of the context (n from max_n down to min_n tokens) that occurred earlier is looked up,
most recent occurrence first, and the tokens that followed it become a chain draft. With `store_tokens` > 0 the
drafter also keeps the conversations (prompt and output) of its earlier generations, up to that many tokens, most
recent kept (the engine hands each finished one to remember()): a suffix of at least `history_min_n` tokens that
the context lacks is looked up there (a single token matches too much of a large store to be worth a draft).

Modes: "history" drafts from the context, then from the store; "pool" from the store only, with matches of at least
POOL_MIN_N tokens: `auto` runs it as a member of its own beside prompt lookup, so the adaptive loop measures the
pool's drafts apart and drafts from it only where they pay (a repeated question, a regenerated answer).
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
    store_tokens: int = 0  # tokens of earlier generations kept as a datastore (0: prompt lookup only)
    history_min_n: int = 2
    context_lookup: bool = True  # False ("pool"): draft from the store only
    _store: "NgramStore | None" = field(default=None, repr=False)

    def __post_init__(self):
        if self.store_tokens > 0:
            self._store = NgramStore(self.store_tokens, self.history_min_n, self.max_n)

    HISTORY_TOKENS = 1 << 16  # what "ngram:history" and "ngram:pool" keep of earlier generations
    POOL_MIN_N = 3  # the pool's shortest match: two tokens of chat text recur across unrelated answers

    def use_mode(self, mode: str) -> None:
        """"history": also draft from earlier generations (a datastore of HISTORY_TOKENS tokens); "pool": only
        from them."""
        if mode not in ("history", "pool"):
            raise ValueError(f"ngram has no mode {mode!r}")
        self.store_tokens = self.HISTORY_TOKENS
        self.context_lookup = mode == "history"
        if mode == "pool":
            self.history_min_n = self.max_n = self.POOL_MIN_N
        self.__post_init__()

    def remember(self, tokens: list[int]) -> None:
        """A finished generation's prompt and output join the store (where the drafter keeps one)."""
        if self._store is not None and len(tokens) > self.history_min_n:
            self._store.add(tokens)

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        shortest = self.min_n if self.context_lookup else self.history_min_n
        if max_tokens < 1 or len(context) < shortest + 1:
            return None
        ctx = np.asarray(context, dtype=np.int64)
        for n in range(min(self.max_n, len(ctx) - 1), shortest - 1, -1):
            suffix = ctx[-n:]
            if self.context_lookup:
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
