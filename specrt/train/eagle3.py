"""Training an EAGLE-3 head on the target's own hidden states (first version: the core loop, no CLI yet).

Data: token sequences; the target (torch reference, models/transformer.py) gives per position t the features
f_t (its aux layers) and its next-token distribution p_{t+1} (after x_{t+1}). Loss, as in EAGLE-3's
training-time test, over `unroll` steps: step 0 feeds (emb(x_{t+1}), fc(f_t)) and is trained towards p_{t+1}
(the distribution of x_{t+2}); step j feeds (emb(x_{t+1+j}), the head's step j-1 pre-norm output at t) and
is trained towards p_{t+1+j}. Each step is one causal pass over the sequence (a simplification of EAGLE-3's
mask, in which step j also attends to the true-feature keys of earlier positions). The loss is
KL(target || head) over the draft vocabulary (soft labels: the target's whole distribution, not its argmax).

Checkpoints are safetensors (weights + Adam moments) plus a JSON of counters, so training resumes after an
interrupt without unpickling anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specrt.models.eagle3 import Eagle3Draft


@dataclass(frozen=True)
class TrainBatch:
    embeds: torch.Tensor  # [B, S, H] target embeddings of x_{t+1}, x_{t+2}, ...: [:, t] is emb(x_{t+1})
    features: torch.Tensor  # [B, S, 3H] target features f_t
    target_probs: torch.Tensor  # [B, S, V_draft] target's distribution of x_{t+2} at t, over the draft vocabulary


@torch.no_grad()
def make_batch(target, head: Eagle3Draft, ids: torch.Tensor) -> TrainBatch:
    """ids [B, L] -> a batch over positions t = 0 .. L - 2 (the last target row has no next token)."""
    logits, _, taps = target(ids, hidden_layers=tuple(sorted(set(head.cfg.aux_layers))))
    layers = sorted(set(head.cfg.aux_layers))
    h = head.cfg.target_hidden_size
    feats = torch.cat([taps[..., layers.index(a) * h:(layers.index(a) + 1) * h] for a in head.cfg.aux_layers], -1)
    embeds = target.model.embed_tokens(ids)
    draft_ids = head.target_ids()
    probs = torch.softmax(logits[:, 1:, draft_ids].float(), -1)  # p_{t+1} over the draft vocabulary
    return TrainBatch(embeds[:, 1:], feats[:, :-1], probs)


def unrolled_loss(head: Eagle3Draft, batch: TrainBatch, unroll: int = 3) -> tuple[torch.Tensor, list[float]]:
    """Mean KL over the unrolled steps; also each step's top-1 agreement with the target."""
    b, s, _ = batch.embeds.shape
    c = head.cfg.layer
    dev = batch.embeds.device
    empty = torch.zeros(b, c.num_kv_heads, 0, c.head_dim, device=dev)
    hidden = head.fuse(batch.features)
    total, agree = 0.0, []
    for j in range(unroll):
        n = s - j  # positions that still have a label j steps ahead
        if n < 1:
            break
        pos = torch.arange(n, device=dev).expand(b, n)
        logits, out, _, _ = head(batch.embeds[:, j:j + n], hidden[:, :n], pos, empty, empty)
        labels = batch.target_probs[:, j:j + n]
        # KL(p || q): the soft cross-entropy minus the target's entropy, so 0 means the head matches the target
        total = total + (labels * (torch.log(labels.clamp_min(1e-20)) - F.log_softmax(logits, -1))).sum(-1).mean()
        agree.append(float((logits.argmax(-1) == labels.argmax(-1)).float().mean()))
        hidden = out  # step j + 1 reads the head's own output at t, paired with the token one further on
    return total / len(agree), agree


def save_checkpoint(folder: Path, head: Eagle3Draft, opt: torch.optim.Optimizer, counters: dict) -> None:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {f"model.{k}": v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    for i, p in enumerate(head.parameters()):
        s = opt.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in s:
                state[f"adam.{i}.{key}"] = s[key].cpu().contiguous()
    tmp = folder / ".train_state.safetensors.partial"
    save_file(state, str(tmp))
    tmp.replace(folder / "train_state.safetensors")
    (folder / "train_state.json").write_text(json.dumps(counters))


def load_checkpoint(folder: Path, head: Eagle3Draft, opt: torch.optim.Optimizer) -> dict:
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "train_state.json").is_file():
        return {"step": 0}
    state = load_file(str(folder / "train_state.safetensors"))
    head.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
    counters = json.loads((folder / "train_state.json").read_text())
    for i, p in enumerate(head.parameters()):
        if f"adam.{i}.exp_avg" in state:
            opt.state[p] = {"step": torch.tensor(float(counters["step"])), "exp_avg": state[f"adam.{i}.exp_avg"].to(p.device),
                            "exp_avg_sq": state[f"adam.{i}.exp_avg_sq"].to(p.device)}
    return counters


def loss_history(folder: Path) -> list[float]:
    """The loss of every step a checkpoint folder has trained, across resumed runs (older checkpoints kept
    none: empty)."""
    state = Path(folder) / "train_state.json"
    return json.loads(state.read_text()).get("losses", []) if state.is_file() else []


def train_loop(target, module, sequences: list[np.ndarray], steps: int, folder: Path, step_loss, describe,
               lr: float = 1e-3, batch_size: int = 4, log=print, save_every: int = 50, device: str = "cpu",
               on_checkpoint=None, warmup: int = 0, clip: float | None = None) -> list[float]:
    """The optimizer loop every drafter trainer shares: `steps` AdamW steps in total (resuming from folder's
    checkpoint) on `device` (target and module are moved there), a linear warm-up over the first `warmup` steps,
    then linear decay to a tenth of lr, gradients clipped to norm `clip` (None: not clipped), a checkpoint every
    `save_every` steps. step_loss(ids [B, L], rng) -> (loss, agreement); describe(agreement) -> the end of the
    step's log line. Returns the losses of this run (loss_history(folder): of every step since the start);
    on_checkpoint(step) runs after each checkpoint."""
    target.to(device)
    module.to(device)
    for p in target.parameters():
        p.requires_grad_(False)
    trained = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    counters = load_checkpoint(folder, module, opt)
    start = counters["step"]
    losses = counters["losses"] = counters.get("losses", [])[:start]  # one per step since the first run
    module.train()
    while counters["step"] < steps:
        rng = np.random.default_rng(counters["step"])  # batch k is the same whether or not training resumed
        picks = rng.choice(len(sequences), size=min(batch_size, len(sequences)), replace=False)
        width = min(len(sequences[i]) for i in picks)
        ids = torch.from_numpy(np.stack([sequences[i][:width] for i in picks]).astype(np.int64)).to(device)
        loss, agree = step_loss(ids, rng)
        step = counters["step"]  # lr is a function of the step, so a resumed run continues exactly
        for group in opt.param_groups:  # warm-up, then linear decay to a tenth of lr
            group["lr"] = lr * (1.0 - 0.9 * step / steps) * min(1.0, (step + 1) / max(1, warmup))
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(trained, clip)
        opt.step()
        counters["step"] += 1
        losses.append(float(loss.detach()))
        log(f"step {counters['step']}/{steps} loss {losses[-1]:.4f} {describe(agree)}")
        if counters["step"] % save_every == 0 or counters["step"] == steps:
            save_checkpoint(folder, module, opt, counters)
            if on_checkpoint is not None:
                on_checkpoint(counters["step"])
                module.train()
    module.eval()
    return losses[start:]


def train(target, head: Eagle3Draft, sequences: list[np.ndarray], steps: int, folder: Path, lr: float = 1e-3,
          unroll: int = 3, batch_size: int = 4, log=print, save_every: int = 50, device: str = "cpu",
          on_checkpoint=None) -> list[float]:
    """Train the head for `steps` optimizer steps in total (train_loop); on_checkpoint(step) is where the recipe
    reports held-back agreement."""
    return train_loop(target, head, sequences, steps, folder,
                      lambda ids, rng: unrolled_loss(head, make_batch(target, head, ids), unroll),
                      lambda agree: f"top-1 by step {[round(a, 3) for a in agree]}",
                      lr=lr, batch_size=batch_size, log=log, save_every=save_every, device=device,
                      on_checkpoint=on_checkpoint)
