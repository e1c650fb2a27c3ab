"""The confidence head of a DFlash drafter, in the spirit of DeepSeek's DSpark: per block position j it predicts
whether the target will accept the draft's token there, given that it accepted the ones before, so the runtime
can cut the block where further tokens stop paying (drafters/dflash/schedule.py).

A few hundred parameters on what the drafter computes anyway: for block position j (1..B-1) with the final
normed hidden state h_j [H] (what the lm_head reads) and the draft's output logits z_j [V_out],

    accept_logit_j = weight . h_j + bias[j - 1] + prob_scale[j - 1] * log max_v softmax(z_j)_v

so it starts from (and can fall back to) the draft's own probability, which the plain cut uses. It is trained
on whether the target's greedy token equals the draft's (train/confidence.py) and runs inside the drafter's
graph as a second output, accept_logits [1, S - 1] (convert/dflash_graph.py).

Stored beside the drafter's checkpoint in a subfolder, CONFIDENCE_FILE (weight [H], bias [B - 1], prob_scale
[B - 1], float32): loaders that read every *.safetensors of the checkpoint folder (vLLM, SGLang, specrt's own)
see only the reference layout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.errors import SourceError

CONFIDENCE_FILE = "specrt_confidence_head/head.safetensors"
NAMES = ("weight", "bias", "prob_scale")


def confidence_path(folder: Path) -> Path:
    return Path(folder) / CONFIDENCE_FILE


def load_confidence_head(folder: Path, hidden: int, block_size: int) -> dict[str, np.ndarray] | None:
    """The head beside a DFlash checkpoint (None when there is none); wrong names or shapes are a SourceError."""
    from specrt.tensor_file import read_safetensors

    path = confidence_path(folder)
    if not path.is_file():
        return None
    tensors = read_safetensors(path)
    want = {"weight": (hidden,), "bias": (block_size - 1,), "prob_scale": (block_size - 1,)}
    if set(tensors) != set(want):
        raise SourceError(f"{path}: a DFlash confidence head holds {', '.join(NAMES)}, found {', '.join(sorted(tensors))}")
    for name, shape in want.items():
        if tuple(tensors[name].shape) != shape:
            raise SourceError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
    return {k: np.asarray(v, np.float32) for k, v in tensors.items()}


def save_confidence_head(folder: Path, head: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    path = confidence_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(np.asarray(head[k], np.float32)) for k in NAMES}, str(path))
    return path


def log_max_prob(logits):
    """logits [..., V] (numpy or torch) -> log of the largest softmax probability [...]."""
    if isinstance(logits, np.ndarray):
        m = logits.max(-1)
        return -np.log(np.exp(logits - m[..., None], dtype=np.float64).sum(-1)).astype(np.float32)
    return logits.max(-1).values - logits.logsumexp(-1)


def accept_logits(hidden, logits, head: dict):
    """hidden [..., S, H] (the block positions 1..S), logits [..., S, V_out] -> accept logits [..., S] (numpy or
    torch, as given; head: numpy or torch tensors of the same kind)."""
    s = hidden.shape[-2]
    return hidden @ head["weight"] + head["bias"][:s] + head["prob_scale"][:s] * log_max_prob(logits)
