"""DFlash drafting: one call of the drafter graph (convert/dflash_graph.py) proposes a whole block.

For a context x_0..x_n (x_n the pending token, not yet read by the target) the drafter feeds the target's
features of the positions it has not read yet (its context cache holds the keys/values of the ones before,
kept while the tokens there stay the same) and the block [x_n, mask, ..., mask] at positions n..n+B-1; the
logits of the masked positions give the draft chain (greedy: argmax; sampling: each position drawn from its
own distribution, which is the q the verifier needs). A drafter with a draft vocabulary (d2t beside its graph)
maps its ids back to target ids; its q is zero outside that vocabulary. The chain is cut by confidence
(schedule.py) where the engine's measured verification costs say further tokens no longer pay. The confidence
of a greedy draft is its confidence head's (models/dflash_confidence.py: the graph's accept_logits) where the
bundle has one, else the draft's own probability; `dflash:prob` and `dflash:head` ask for one of the two. A
sampled draft always uses its own probability (the head learned whether the target's greedy token agrees).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.drafter_entry import DrafterEntry
from specrt.errors import SpecrtError
from specrt.dflash_io import call_feeds
from specrt.drafters.dflash.schedule import cut_length
from specrt.drafters.draft_vocab import load_draft_targets, to_target_vocab
from specrt.runtime.drafter import Draft, Drafter, TargetView, common_prefix
from specrt.runtime.sampling import SamplingParams, target_probs
from specrt.runtime.target_session import open_session


CUTS = ("prob", "head")  # the modes a drafter name may ask for: dflash:prob, dflash:head


def _softmax_max(logits: np.ndarray) -> np.ndarray:
    """Probability of the most likely token per row [R]."""
    m = logits.max(-1, keepdims=True)
    return 1.0 / np.exp(logits - m, dtype=np.float64).sum(-1)


class DFlashDrafter(Drafter):
    name = "dflash"
    reads_hidden_states = True
    block_drafter = True  # one call drafts the whole block: its cost does not grow with the draft length

    def __init__(self, bundle_dir: Path, entry: DrafterEntry, providers, threads: int = 0):

        kv = entry.kv
        self.session = open_session(Path(bundle_dir) / entry.graph.file, threads, providers, entry.kv.layers)
        self.layers, self.kv_heads, self.head_dim, self.max_context = kv.layers, kv.kv_heads, kv.head_dim, kv.max_context
        self.block_size, self.mask = entry.block_size, entry.mask_token_id
        self.vocab_size = entry.vocab_size
        # [V_draft] target id of each draft id; None: the drafter predicts every target id
        self.targets = load_draft_targets(bundle_dir, entry, entry.vocab_size, entry.raw.get("draft_vocab_size"))
        self.target_layers = entry.target_layer_ids
        self.columns: np.ndarray | None = None  # columns of the target's taps holding its layers, in its order
        self.max_draft: int | None = self.block_size - 1  # the engine may ask for the whole block
        self.seconds = None  # call cost by tokens fed, from the engine's controller: cut the block by confidence
        self.target: TargetView | None = None
        self.params, self.rng = SamplingParams(temperature=0.0), np.random.default_rng()
        self.has_head = "accept_logits" in {o.name for o in self.session.get_outputs()}
        self.cut = "head" if self.has_head else "prob"  # what greedy confidence comes from
        self._clear()

    def use_mode(self, mode: str) -> None:
        """dflash:prob cuts by the draft's probability, dflash:head by the confidence head (which the bundle
        must have)."""
        if mode not in CUTS:
            raise SpecrtError(f"dflash:{mode}: the DFlash drafter takes :prob or :head")
        if mode == "head" and not self.has_head:
            raise SpecrtError("dflash:head: this bundle's DFlash drafter has no confidence head (train one with "
                              "specrt train-drafter --kind dflash, or use dflash:prob)")
        self.cut = mode

    @classmethod
    def from_bundle(cls, bundle_dir, entry, manifest, providers, threads: int = 0) -> "DFlashDrafter":
        return cls(bundle_dir, entry, providers, threads=threads)

    def _clear(self) -> None:
        empty = np.zeros((1, self.kv_heads, 0, self.head_dim), np.float32)
        self.past = [empty] * (2 * self.layers)  # context keys/values per layer
        self.read: list[int] = []  # tokens whose features the cache holds (positions 0..len-1)

    def bind(self, target: TargetView) -> None:
        self.target, self.columns = target, target.columns(self.target_layers)

    def reset(self, params: SamplingParams | None = None, rng: np.random.Generator | None = None) -> None:
        self.params = params or SamplingParams(temperature=0.0)
        self.rng = rng if rng is not None else np.random.default_rng()

    def use_costs(self, seconds) -> None:
        """seconds(fed): the measured cost of a target call feeding `fed` tokens (the adaptive controller's);
        None: no cut (a fixed draft length was asked for)."""
        self.seconds = seconds

    def backlog(self, context: list[int]) -> int:
        n = len(context) - 1
        return n - common_prefix(self.read, context[:n])

    def propose(self, context: list[int], max_tokens: int) -> Draft | None:
        n = len(context) - 1  # the target has read context[:n]: features f_0 .. f_{n-1}
        # the whole trained block, whatever the draft length asked for: attention inside the block is not
        # causal, so a shorter block would change every position's output from what training taught
        block = min(self.block_size, self.max_context - n)
        if self.target is None or n < 1 or block < 2 or max_tokens < 1:
            return None
        keep = min(common_prefix(self.read, context[:n]), n - 1)  # at least one new context position
        if keep < len(self.read):
            self.past = [p[:, :, :keep] for p in self.past]
        feats = self.target.features(keep, n, self.columns)[None]  # [1, C, F]
        ids = np.array([[context[n]] + [self.mask] * (block - 1)], dtype=np.int64)
        positions = np.arange(keep, n + block, dtype=np.int64)[None]
        out = self.session.run(None, call_feeds(self.session, ids, feats, positions, self.past))
        logits, self.past, self.read = out[0][0], out[1:1 + 2 * self.layers], list(context[:n])  # [block - 1, V']
        if self.params.greedy:
            best = logits.argmax(-1)
            tokens = [int(t) for t in (best if self.targets is None else self.targets[best])]
            probs = None
            if self.cut == "head":  # the head's estimate that the target agrees here, given the ones before
                confidence = 1.0 / (1.0 + np.exp(-out[-1][0].astype(np.float64)))
            else:
                confidence = _softmax_max(logits)
        else:
            if self.targets is not None:
                logits = to_target_vocab(logits, self.targets, self.vocab_size)  # [block - 1, V]
            rows = [target_probs(row, self.params) for row in logits]
            tokens = [int(self.rng.choice(len(q), p=q)) for q in rows]
            probs = np.stack(rows)
            confidence = probs[np.arange(len(tokens)), tokens]
        k = min(len(tokens), max_tokens)
        if self.seconds is not None and k > 1:
            k = cut_length(confidence, self.seconds, k)
        return Draft.chain(tokens[:k], None if probs is None else probs[:k])
