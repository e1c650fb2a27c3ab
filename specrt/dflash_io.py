"""What one call of a DFlash graph (convert/dflash_graph.py) is fed, shared by the drafter that runs it
(drafters/dflash) and the conversion that validates it: the graph's float type for features and caches (float16 in
a GPU bundle), and a GPU graph's host lengths."""

from __future__ import annotations

import numpy as np

CONTEXT_LENGTH, BLOCK_LENGTH = "context_length", "block_length"  # a GPU graph's host inputs [1] int64


def call_feeds(session, ids: np.ndarray, feats: np.ndarray, positions: np.ndarray, past: list) -> dict:
    """Feeds for a session over a DFlash graph: ids [1, S], feats [1, C, F], positions [1, C + S], past: per layer
    key then value [1, KV, P, D]."""
    kinds = {i.name: i.type for i in session.get_inputs()}
    dtype = np.float16 if "float16" in kinds["features"] else np.float32
    names = ["input_ids", "features", "position_ids"] + [
        f"past_key_values.{i}.{kv}" for i in range(len(past) // 2) for kv in ("key", "value")]
    feeds = dict(zip(names, [ids, feats.astype(dtype), positions, *(p.astype(dtype, copy=False) for p in past)]))
    if CONTEXT_LENGTH in kinds:
        feeds[CONTEXT_LENGTH] = np.array([feats.shape[1]], dtype=np.int64)
        feeds[BLOCK_LENGTH] = np.array([ids.shape[1]], dtype=np.int64)
    return feeds
