"""Training a DFlash drafter on the target's own hidden states (the recipe: train/recipe.py).

Per sequence [L] the target (torch reference) gives the features of every position (its hidden states at the
drafter's layers) and its next-token distributions. `anchors` random positions a per sequence each make one
training block: input [x_a, mask, ..., mask] at positions a..a+B-1, reading the context features of positions
< a (what the drafter has at inference: the target has not read x_a yet), non-causal inside the block. All
blocks of a sequence go through the drafter in one pass under an attention mask (each block sees its own
context prefix and itself only). Block position j (1..B-1) is trained towards the target's distribution of
x_{a+j} given the true prefix (KL, soft labels, through the target's frozen lm_head).

Choices from recipe experiments on a CPU budget (the first drafter, trained without them, stayed at unigram
level: no better at block position 1 than at 7; what the shipped drafter reaches: docs/performance.md, "The
default model (SmolLM2-135M-Instruct)"):
- Position weights follow the drafter's own confidence: position j weighs prod_{i<j} (1 + q_i) / 2, with q_i the
  drafter's probability of the target's token at position i (detached). Early in training only the first
  positions count, as an early miss voids every later one; later positions gain weight as the earlier ones
  become right. A fixed exp(-(j - 1) / 4) decay spent most of the loss on positions that cannot be right yet.
- The softmax runs over candidates, not the whole vocabulary: the target's top-16 tokens of every row in the
  batch, the training data's most frequent tokens, and the drafter's own top-4 of each row over the whole
  vocabulary (found without gradient; without them tokens never among the candidates are never pushed down and
  win the whole-vocabulary argmax). The lm_head's backward pass over 49k tokens was most of a drafter step;
  held-back agreement is always measured over the whole vocabulary.
- A 20-step warm-up and gradients clipped to norm 1.
- bf16 (`--precision bf16`): the drafter's pass and the target's layers run under torch's bf16 autocast (4x
  faster drafter steps on a CPU with avx512_bf16), the target's lm_head and the loss in fp32 (the teacher's
  argmax then agrees with an fp32 target on 99.5% of rows; held-back agreement is always measured in fp32).

Checkpoints (weights + Adam moments, safetensors) and resumption are shared with EAGLE-3's trainer.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from specrt.models.dflash import DFlashDraft


class DFlashTrainee(torch.nn.Module):
    """The drafter plus the frozen target embedding and lm_head it uses (only the drafter is saved)."""

    def __init__(self, draft: DFlashDraft, embed: torch.Tensor, lm_head: torch.Tensor,
                 frequent: torch.Tensor | None = None):
        """frequent [K]: token ids always among the loss's candidates (the data's most frequent tokens); None:
        the loss runs over the whole vocabulary."""
        super().__init__()
        self.draft = draft
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("lm_head", lm_head, persistent=False)
        self.register_buffer("frequent", frequent, persistent=False)

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


def confidence_weights(q: torch.Tensor) -> torch.Tensor:
    """q [A, B - 1]: the drafter's probability of the target's token at each block position -> weights
    [A, B - 1]: position j weighs prod_{i<j} (1 + q_i) / 2 (1 at the first position), no gradient."""
    q = q.detach()
    half = 0.5 + 0.5 * q[:, :-1]
    return torch.cumprod(torch.cat((torch.ones_like(q[:, :1]), half), dim=1), dim=1)


def block_hidden(trainee: DFlashTrainee, ids: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """ids [L], features [L, F], anchors [A] -> the drafter's final normed hidden state at the masked positions of
    every anchor's block [A, B - 1, H] (block a: [x_a, mask, ...] at a..a+B-1, reading the context < a)."""
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
    return hidden.view(len(anchors), b, -1)[:, 1:]


def block_loss(trainee: DFlashTrainee, ids: torch.Tensor, features: torch.Tensor, target_logits: torch.Tensor,
               anchors: torch.Tensor, candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, list[float]]:
    """ids [L], features [L, F], target_logits [L, V] (row t: distribution of x_{t+1}), anchors [A] with
    a + block <= L, candidates [C] token ids holding every row's target argmax (None: the whole vocabulary).
    Returns the confidence-weighted KL and top-1 agreement with the target by block position."""
    hidden = block_hidden(trainee, ids, features, anchors)  # [A, b - 1, H]
    offsets = torch.arange(trainee.draft.cfg.block_size, device=ids.device)
    if candidates is not None:  # add the drafter's own favourites over the whole vocabulary (hard negatives)
        with torch.no_grad():
            favourites = (hidden.detach() @ trainee.lm_head.t()).topk(4, dim=-1).indices.flatten()
        candidates = torch.unique(torch.cat((candidates, favourites)))
    head = trainee.lm_head if candidates is None else trainee.lm_head[candidates]  # [C, H]
    log_q = F.log_softmax(hidden @ head.t(), -1)  # [A, b - 1, C]
    rows = (anchors[:, None] + offsets[1:] - 1)  # target row predicting x_{a + j}
    # one gather of the rows' candidate columns, not a copy of whole rows first
    teacher = target_logits[rows] if candidates is None else target_logits[rows[..., None], candidates]
    labels = torch.softmax(teacher.float(), -1)  # [A, b - 1, C]
    kl = (labels * (torch.log(labels.clamp_min(1e-20)) - log_q)).sum(-1)  # [A, b - 1]
    best = labels.argmax(-1, keepdim=True)  # [A, b - 1, 1]
    weights = confidence_weights(log_q.gather(-1, best)[..., 0].exp())
    loss = (kl * weights).sum() / weights.sum()
    agree = (log_q.argmax(-1) == best[..., 0]).float().mean(0)
    return loss, [round(float(x), 3) for x in agree]


def loss_candidates(logits: torch.Tensor, frequent: torch.Tensor | None, top: int = 16) -> torch.Tensor | None:
    """logits [B, L, V] -> the sorted union of every row's top tokens and `frequent` (None: whole vocabulary)."""
    if frequent is None:
        return None
    tops = logits.topk(top, dim=-1).indices.flatten()
    return torch.unique(torch.cat((tops, frequent.to(tops.device))))


def autocast(ids: torch.Tensor, bf16: bool):
    """bf16 autocast on ids' device type when bf16, else nothing."""
    return torch.autocast(ids.device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


@torch.no_grad()
def target_pass(target, ids: torch.Tensor, layers: tuple[int, ...], bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, L] -> (features [B, L, n * H] in the drafter's layer order, logits [B, L, V]), fp32. bf16: the
    layers run under bf16 autocast, the final norm and lm_head in fp32 on the last layer's output."""
    last = target.cfg.num_layers - 1
    taps_order = tuple(sorted(set(layers) | ({last} if bf16 else set())))
    with autocast(ids, bf16):
        logits, _, taps = target(ids, hidden_layers=taps_order)
    taps = taps.float()
    h = taps.shape[-1] // len(taps_order)

    def tap(i: int) -> torch.Tensor:  # [B, L, H]
        return taps[..., taps_order.index(i) * h:(taps_order.index(i) + 1) * h]

    if bf16:
        logits = target.lm_head(target.model.norm(tap(last)))
    feats = torch.cat([tap(i) for i in layers], -1)
    return feats, logits


def pick_anchors(rng: np.random.Generator, length: int, block: int, count: int) -> np.ndarray:
    """count distinct anchors in 1..length - block (each needs context before it and a whole block after)."""
    hi = length - block
    if hi < 1:
        raise ValueError(f"sequences of {length} tokens are too short for blocks of {block}")
    return np.sort(rng.choice(np.arange(1, hi + 1), size=min(count, hi), replace=False))


def batch_loss(trainee, target, ids: torch.Tensor, rng: np.random.Generator, anchors: int, bf16: bool = False):
    """ids [B, L]: mean loss over the sequences; agreement by position averaged too. bf16: the passes run under
    bf16 autocast (module docstring)."""
    cfg = trainee.draft.cfg
    feats, logits = target_pass(target, ids, cfg.target_layer_ids, bf16)
    candidates = loss_candidates(logits, trainee.frequent) if trainee.training else None
    total, agree = 0.0, np.zeros(cfg.block_size - 1)
    for i in range(ids.shape[0]):
        a = torch.from_numpy(pick_anchors(rng, ids.shape[1], cfg.block_size, anchors)).to(ids.device)
        with autocast(ids, bf16):
            loss, ag = block_loss(trainee, ids[i], feats[i], logits[i], a, candidates)
        total = total + loss.float()
        agree += ag
    return total / ids.shape[0], (agree / ids.shape[0]).round(3).tolist()


def train(target, trainee: DFlashTrainee, sequences: list[np.ndarray], steps: int, folder, lr: float = 1e-3,
          batch_size: int = 4, anchors: int = 8, log=print, save_every: int = 50, device: str = "cpu",
          on_checkpoint=None, warmup: int = 20, clip: float | None = 1.0, bf16: bool = False) -> list[float]:
    """`steps` optimizer steps in total, resuming from folder's checkpoint (the loop EAGLE-3's trainer uses,
    with a warm-up and clipped gradients: without them the drafter stayed at one constant prediction for 150
    steps in the recipe experiments); returns the losses of this run. bf16: autocast (module docstring)."""
    from specrt.train.eagle3 import train_loop

    return train_loop(target, trainee, sequences, steps, folder,
                      lambda ids, rng: batch_loss(trainee, target, ids, rng, anchors, bf16),
                      lambda agree: f"top-1 by block position {agree[:8]}",
                      lr=lr, batch_size=batch_size, log=log, save_every=save_every, device=device,
                      on_checkpoint=on_checkpoint, warmup=warmup, clip=clip)


@torch.no_grad()
def held_back_agreement(target, trainee: DFlashTrainee, held: list[np.ndarray], anchors: int = 8) -> list[float]:
    """Top-1 agreement with the target by block position on held-back sequences (fixed anchors, whole
    vocabulary)."""
    trainee.eval()
    dev = trainee.embed.device
    rng = np.random.default_rng(12345)
    sums = np.zeros(trainee.draft.cfg.block_size - 1)
    for seq in held:
        _, agree = batch_loss(trainee, target, torch.from_numpy(seq[None]).to(dev), rng, anchors)
        sums += agree
    return (sums / max(1, len(held))).round(3).tolist()
