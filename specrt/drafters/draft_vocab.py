"""Drafters that predict over a reduced draft vocabulary (EAGLE-3 heads, DFlash drafters with a d2t): the
bundle keeps the map beside the drafter's graph as NAME.d2t.safetensors, draft id d being target id d + d2t[d].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.drafter_entry import DrafterEntry
from specrt.errors import BundleError
from specrt.tensor_file import read_safetensors


def load_draft_targets(bundle_dir: Path, entry: DrafterEntry, target_vocab: int | None = None,
                       draft_vocab: int | None = None) -> np.ndarray | None:
    """[V_draft] target id of each draft id, from the d2t file among the drafter's extra_files (None: it has
    none and predicts over the whole target vocabulary). Read with numpy alone: a runtime-only install has no
    safetensors package. A map of another length than the drafter's output (draft_vocab), or to ids outside
    the target's vocabulary or repeated, is a BundleError."""
    files = [f for f in entry.extra_files if f.endswith(".d2t.safetensors")]
    if not files:
        return None
    path = Path(bundle_dir) / files[0]
    d2t = read_safetensors(path).get("d2t")
    if d2t is None or d2t.ndim != 1 or d2t.dtype.kind not in "iu":
        raise BundleError(f"{path}: no one-dimensional integer tensor 'd2t'")
    if draft_vocab is not None and len(d2t) != draft_vocab:
        raise BundleError(f"{path}: d2t maps {len(d2t)} draft ids, the drafter predicts {draft_vocab}")
    targets = np.arange(len(d2t)) + d2t.astype(np.int64)
    if target_vocab is not None and len(targets) and (targets.min() < 0 or targets.max() >= target_vocab
                                                      or len(np.unique(targets)) != len(targets)):
        raise BundleError(f"{path}: d2t maps draft ids to target ids outside 0..{target_vocab - 1} or twice")
    return targets


def to_target_vocab(logits: np.ndarray, targets: np.ndarray, vocab: int) -> np.ndarray:
    """Draft logits [..., V_draft] -> target logits [..., vocab], -inf outside the draft vocabulary."""
    full = np.full((*logits.shape[:-1], vocab), -np.inf, np.float32)
    full[..., targets] = logits
    return full
