"""Training a DFlash drafter on the target's own hidden states (the recipe: drafters/eagle3/recipe.py).

Per sequence [L] the target (torch reference) gives the features of every position (its hidden states at the
drafter's layers) and its next-token distributions. `anchors` random positions a per sequence each make one
training block: input [x_a, mask, ..., mask] at positions a..a+B-1, reading the context features of positions
< a (what the drafter has at inference: the target has not read x_a yet), non-causal inside the block. All
blocks of a sequence go through the drafter in one pass under an attention mask (each block sees its own
context prefix and itself only). Block position j (1..B-1) is trained towards the target's distribution of
x_{a+j} given the true prefix (KL, soft labels over the whole vocabulary, through the target's frozen lm_head),
weighted exp(-(j - 1) / decay) as DFlash does, since an early miss voids every later position.

Checkpoints (weights + Adam moments, safetensors) and resumption are shared with EAGLE-3's trainer.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from specrt.models.dflash import DFlashDraft


class DFlashTrainee(torch.nn.Module):
    """The drafter plus the frozen target embedding and lm_head it uses (only the drafter is saved)."""

    def __init__(self, draft: DFlashDraft, embed: torch.Tensor, lm_head: torch.Tensor):
        super().__init__()
        self.draft = draft
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("lm_head", lm_head, persistent=False)

    def state_dict(self, *args, **kwargs):  # what checkpoints hold: the drafter's own weights
        return self.draft.state_dict(*args, **kwargs)

    def load_state_dict(self, state, strict: bool = True):
        return self.draft.load_state_dict(state, strict=strict)

    def parameters(self, recurse: bool = True):
        return self.draft.parameters(recurse)


def block_mask(anchors: torch.Tensor, block: int, ctx_len: int) -> torch.Tensor:
    """anchors [A] -> additive mask [1, 1, A * block, ctx_len + A * block]: block i sees context < anchors[i]
    and its own block."""
    a = len(anchors)
    q_block = torch.arange(a * block) // block  # [A * block] which block a query belongs to
    ctx_ok = torch.arange(ctx_len)[None, :] < anchors[q_block][:, None]  # [A * block, ctx_len]
    own = q_block[:, None] == q_block[None, :]  # [A * block, A * block]
    visible = torch.cat((ctx_ok, own), dim=1)
    return torch.where(visible, 0.0, float("-inf"))[None, None]


def block_loss(trainee: DFlashTrainee, ids: torch.Tensor, features: torch.Tensor, target_logits: torch.Tensor,
               anchors: torch.Tensor, decay: float = 4.0) -> tuple[torch.Tensor, list[float]]:
    """ids [L], features [L, F], target_logits [L, V] (row t: distribution of x_{t+1}), anchors [A] with
    a + block <= L. Returns the weighted KL and top-1 agreement with the target by block position."""
    cfg = trainee.draft.cfg
    b = cfg.block_size
    dev = ids.device
    offsets = torch.arange(b, device=dev)
    block_ids = torch.full((len(anchors), b), cfg.mask_token_id, dtype=torch.long, device=dev)
    block_ids[:, 0] = ids[anchors]
    positions = (anchors[:, None] + offsets).reshape(1, -1)  # [1, A * b]
    embeds = trainee.embed[block_ids].reshape(1, -1, trainee.embed.shape[1])
    mask = block_mask(anchors.cpu(), b, len(ids)).to(dev)
    ctx_pos = torch.arange(len(ids), device=dev)[None]
    hidden, _ = trainee.draft(features[None], embeds, ctx_pos, positions, trainee.draft.empty_cache(1), mask)
    hidden = hidden.view(len(anchors), b, -1)[:, 1:]  # [A, b - 1, H]: the masked positions
    logits = hidden @ trainee.lm_head.t()  # [A, b - 1, V]
    rows = (anchors[:, None] + offsets[1:] - 1)  # target row predicting x_{a + j}
    labels = torch.softmax(target_logits[rows].float(), -1)  # [A, b - 1, V]
    kl = (labels * (torch.log(labels.clamp_min(1e-20)) - F.log_softmax(logits, -1))).sum(-1)  # [A, b - 1]
    weights = torch.exp(-torch.arange(b - 1, device=dev, dtype=torch.float32) / decay)
    loss = (kl * weights).sum(-1).mean() / weights.sum()
    agree = (logits.argmax(-1) == labels.argmax(-1)).float().mean(0)
    return loss, [round(float(x), 3) for x in agree]


@torch.no_grad()
def target_pass(target, ids: torch.Tensor, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, L] -> (features [B, L, n * H] in the drafter's layer order, logits [B, L, V])."""
    taps_order = tuple(sorted(set(layers)))
    logits, _, taps = target(ids, hidden_layers=taps_order)
    h = taps.shape[-1] // len(taps_order)
    feats = torch.cat([taps[..., taps_order.index(i) * h:(taps_order.index(i) + 1) * h] for i in layers], -1)
    return feats, logits


def pick_anchors(rng: np.random.Generator, length: int, block: int, count: int) -> np.ndarray:
    """count distinct anchors in 1..length - block (each needs context before it and a whole block after)."""
    hi = length - block
    if hi < 1:
        raise ValueError(f"sequences of {length} tokens are too short for blocks of {block}")
    return np.sort(rng.choice(np.arange(1, hi + 1), size=min(count, hi), replace=False))


def batch_loss(trainee, target, ids: torch.Tensor, rng: np.random.Generator, anchors: int):
    """ids [B, L]: mean loss over the sequences; agreement by position averaged too."""
    cfg = trainee.draft.cfg
    feats, logits = target_pass(target, ids, cfg.target_layer_ids)
    total, agree = 0.0, np.zeros(cfg.block_size - 1)
    for i in range(ids.shape[0]):
        a = torch.from_numpy(pick_anchors(rng, ids.shape[1], cfg.block_size, anchors)).to(ids.device)
        loss, ag = block_loss(trainee, ids[i], feats[i], logits[i], a)
        total = total + loss
        agree += ag
    return total / ids.shape[0], (agree / ids.shape[0]).round(3).tolist()


def train(target, trainee: DFlashTrainee, sequences: list[np.ndarray], steps: int, folder, lr: float = 1e-3,
          batch_size: int = 4, anchors: int = 8, log=print, save_every: int = 50, device: str = "cpu",
          on_checkpoint=None) -> list[float]:
    """`steps` optimizer steps in total, resuming from folder's checkpoint (the loop EAGLE-3's trainer uses);
    returns the losses of this run."""
    from specrt.drafters.eagle3.train import train_loop

    return train_loop(target, trainee, sequences, steps, folder,
                      lambda ids, rng: batch_loss(trainee, target, ids, rng, anchors),
                      lambda agree: f"top-1 by block position {agree[:8]}",
                      lr=lr, batch_size=batch_size, log=log, save_every=save_every, device=device,
                      on_checkpoint=on_checkpoint)


@torch.no_grad()
def held_back_agreement(target, trainee: DFlashTrainee, held: list[np.ndarray], anchors: int = 8) -> list[float]:
    """Top-1 agreement with the target by block position on held-back sequences (fixed anchors)."""
    trainee.draft.eval()
    dev = trainee.embed.device
    rng = np.random.default_rng(12345)
    sums = np.zeros(trainee.draft.cfg.block_size - 1)
    for seq in held:
        _, agree = batch_loss(trainee, target, torch.from_numpy(seq[None]).to(dev), rng, anchors)
        sums += agree
    return (sums / max(1, len(held))).round(3).tolist()
