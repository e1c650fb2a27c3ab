"""Training a DFlash drafter's confidence head (models/dflash_confidence.py), after the drafter itself.

The drafter is frozen. For random blocks of training sequences it drafts greedily as at inference (over its
draft vocabulary, d2t), and each block position j gives one example: the final hidden state h_j, the log of the
draft's top probability, and whether the draft's token equals the target's greedy token there. The head
predicts acceptance *given that positions 1..j-1 were accepted* (the chain stops at the first miss, and the
schedule multiplies these), so position j's example counts only where the draft agreed at every position before
it. Logistic regression, full batch, Adam; it starts at the draft's own probability (prob_scale 1, bias 0,
weight 0), so it can only move away from the plain cut where the data says so.

held_back_report compares the head with the draft probability used as the acceptance estimate (what the plain
cut does) on held-back sequences: log-loss and the mean predicted vs observed acceptance per position.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from specrt.models.dflash_confidence import log_max_prob
from specrt.train.dflash import DFlashTrainee, block_hidden, pick_anchors, target_pass


@torch.no_grad()
def collect(target, trainee: DFlashTrainee, sequences: list[np.ndarray], draft_ids: np.ndarray, anchors: int,
            seed: int = 0, bf16: bool = False) -> dict[str, torch.Tensor]:
    """Examples from `anchors` random blocks per sequence: hidden [N, B-1, H], log_top [N, B-1] (log of the
    draft's top probability over the draft vocabulary), agree [N, B-1] (draft token == target's greedy token),
    reached [N, B-1] (every position before agreed)."""
    trainee.eval()
    cfg = trainee.draft.cfg
    rng = np.random.default_rng(seed)
    dev = trainee.embed.device
    vocab = torch.from_numpy(np.asarray(draft_ids, np.int64)).to(dev)
    head = trainee.lm_head[vocab]  # [V_draft, H]
    out = {"hidden": [], "log_top": [], "agree": []}
    for seq in sequences:
        ids = torch.from_numpy(np.asarray(seq, np.int64)[None]).to(dev)
        feats, logits = target_pass(target, ids, cfg.target_layer_ids, bf16)
        a = torch.from_numpy(pick_anchors(rng, ids.shape[1], cfg.block_size, anchors)).to(dev)
        hidden = block_hidden(trainee, ids[0], feats[0], a)  # [A, B-1, H]
        draft_logits = hidden @ head.t()  # [A, B-1, V_draft]
        rows = a[:, None] + torch.arange(1, cfg.block_size, device=dev) - 1  # target row predicting x_{a+j}
        agree = vocab[draft_logits.argmax(-1)] == logits[0][rows].argmax(-1)
        out["hidden"].append(hidden)
        out["log_top"].append(log_max_prob(draft_logits))
        out["agree"].append(agree.float())
    data = {k: torch.cat(v) for k, v in out.items()}
    ones = torch.ones_like(data["agree"][:, :1])
    data["reached"] = torch.cumprod(torch.cat((ones, data["agree"][:, :-1]), 1), 1)
    return data


def head_logits(head: dict[str, torch.Tensor], data: dict[str, torch.Tensor]) -> torch.Tensor:
    """[N, B-1]: the head's accept logits (models/dflash_confidence.py accept_logits on collected examples)."""
    return data["hidden"] @ head["weight"] + head["bias"] + head["prob_scale"] * data["log_top"]


def fit(data: dict[str, torch.Tensor], steps: int = 300, lr: float = 1e-2, l2: float = 1e-3) -> dict[str, np.ndarray]:
    """The head's tensors (numpy float32) fitted to collected examples by conditional logistic regression."""
    hidden, positions = data["hidden"].shape[-1], data["agree"].shape[1]
    head = {"weight": torch.zeros(hidden, requires_grad=True), "bias": torch.zeros(positions, requires_grad=True),
            "prob_scale": torch.ones(positions, requires_grad=True)}
    opt = torch.optim.Adam(list(head.values()), lr=lr)
    weights = data["reached"] / data["reached"].sum().clamp_min(1.0)
    for _ in range(steps):
        opt.zero_grad()
        loss = (F.binary_cross_entropy_with_logits(head_logits(head, data), data["agree"], reduction="none")
                * weights).sum() + l2 * head["weight"].pow(2).sum()
        loss.backward()
        opt.step()
    return {k: v.detach().numpy().astype(np.float32) for k, v in head.items()}


@torch.no_grad()
def held_back_report(head: dict[str, np.ndarray], data: dict[str, torch.Tensor]) -> dict:
    """Log-loss over the reached positions of the head and of the draft's own probability as the estimate, and
    per position the observed acceptance, the head's mean estimate and the draft probability's."""
    tensors = {k: torch.from_numpy(v) for k, v in head.items()}
    reached, agree = data["reached"], data["agree"]
    p_head = torch.sigmoid(head_logits(tensors, data)).clamp(1e-6, 1 - 1e-6)
    p_prob = data["log_top"].exp().clamp(1e-6, 1 - 1e-6)

    def log_loss(p):
        return float((-(agree * p.log() + (1 - agree) * (1 - p).log()) * reached).sum() / reached.sum())

    count = reached.sum(0).clamp_min(1.0)
    return {"log_loss_head": round(log_loss(p_head), 4), "log_loss_draft_probability": round(log_loss(p_prob), 4),
            "reached_by_position": reached.sum(0).int().tolist(),
            "accepted_by_position": [round(float(x), 3) for x in (agree * reached).sum(0) / count],
            "head_estimate_by_position": [round(float(x), 3) for x in (p_head * reached).sum(0) / count],
            "draft_probability_by_position": [round(float(x), 3) for x in (p_prob * reached).sum(0) / count]}
