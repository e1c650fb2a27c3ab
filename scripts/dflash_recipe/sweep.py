"""DFlash recipe experiments on cached target data (docs/perf.md, issue 7, "Why the first DFlash drafter was
weak"): one variation of the drafter or its loss per run, held-back top-1 agreement by block position every 50
steps (8 held-back sequences, anchors every 3rd position). For speed the softmax runs over a reduced
vocabulary (the tokens in the data and in the target's top-4 anywhere in it, ~6.8k), for training and
evaluation alike, so the numbers compare runs with each other, not with the whole-vocabulary agreement of
`specrt train-drafter`.

    python scripts/dflash_recipe/sweep.py --steps 150                  # the first recipe: decay 4, copy init
    python scripts/dflash_recipe/sweep.py --steps 150 --weights confidence
    python scripts/dflash_recipe/sweep.py --steps 150 --decay 1
    python scripts/dflash_recipe/sweep.py --steps 150 --no-context     # the block alone, no target features
"""

import argparse
import dataclasses
import time

import numpy as np
import torch
import torch.nn.functional as F

from specrt.convert import sources
from specrt.train.dflash import block_mask, confidence_weights
from specrt.train.recipe import dflash_config
from specrt.models.dflash import DFlashDraft

p = argparse.ArgumentParser()
p.add_argument("--anchors", type=int, default=32)
p.add_argument("--layers", type=int, default=1)
p.add_argument("--kv-heads", type=int, default=0, help="0: the target's (3); 9: multi-head attention")
p.add_argument("--init", choices=["copy", "fresh"], default="copy", help="copy: the target's last layers")
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--norm-lr", type=float, default=1.0, help="lr multiplier of the norm weights")
p.add_argument("--qk", type=float, default=1.0, help="initial q/k norm weights")
p.add_argument("--fc-init", choices=["default", "rms"], default="default", help="rms: columns over feature RMS")
p.add_argument("--steps", type=int, default=200)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--block", type=int, default=8)
p.add_argument("--no-sink", action="store_true", help="hide context position 0 (the attention sink)")
p.add_argument("--no-context", action="store_true", help="hide every context position")
p.add_argument("--window", type=int, default=0, help="sliding window from each query's position")
p.add_argument("--context-window", type=int, default=0, help="only the last N context positions before the anchor")
p.add_argument("--weights", choices=["decay", "confidence"], default="decay")
p.add_argument("--decay", type=float, default=4.0)
p.add_argument("--loss", choices=["soft", "hard"], default="soft")
p.add_argument("--cache", default="cache96.pt")
a = p.parse_args()
print(vars(a), flush=True)
torch.manual_seed(0)
loaded = sources.load(sources.resolve("smollm2-135m-instruct"))
t, w = loaded.config, loaded.weights
c = torch.load(a.cache)
ids, feats, top_ids, top_p = c["ids"], c["feats"].float(), c["top_ids"].long(), c["top_p"].float()
n, length = len(ids), ids.shape[1]
held, train = list(range(n - 8, n)), list(range(n - 8))
cfg = dflash_config(t, a.block, 3, a.layers)
if a.kv_heads:
    cfg = dataclasses.replace(cfg, layers=dataclasses.replace(cfg.layers, num_kv_heads=a.kv_heads))
draft = DFlashDraft(cfg)
with torch.no_grad():
    if a.init == "copy":
        for li, layer in enumerate(draft.layers):
            prefix = f"model.layers.{t.num_layers - 1 - li}."
            for name, prm in layer.named_parameters():
                if prefix + name in w and tuple(w[prefix + name].shape) == tuple(prm.shape):
                    prm.copy_(torch.from_numpy(np.array(w[prefix + name], dtype=np.float32)))
            layer.self_attn.o_proj.weight.mul_(0.1)
    for layer in draft.layers:
        layer.self_attn.q_norm.weight.fill_(a.qk)
        layer.self_attn.k_norm.weight.fill_(a.qk)
    if a.fc_init == "rms":
        rms = feats[:, 1:].pow(2).mean((0, 1)).sqrt()  # [F]
        draft.fc.weight.div_(rms[None] / rms.mean())
    draft.norm.weight.copy_(torch.from_numpy(np.array(w["model.norm.weight"], dtype=np.float32)))
embed = torch.from_numpy(np.array(w["model.embed_tokens.weight"], dtype=np.float32))
vocab = torch.unique(torch.cat([top_ids[..., :4].flatten(), ids.flatten()]))
remap = torch.full((embed.shape[0],), -1, dtype=torch.long)
remap[vocab] = torch.arange(len(vocab))
head = embed[vocab]  # [V', H]
print("reduced vocabulary", len(vocab), flush=True)
top_ids = remap[top_ids]
top_p = torch.where(top_ids >= 0, top_p, 0.0)
top_ids = top_ids.clamp_min(0)
B = a.block


def loss_of(i, anchors):
    off = torch.arange(B)
    block_ids = torch.full((len(anchors), B), cfg.mask_token_id)
    block_ids[:, 0] = ids[i][anchors]
    pos = (anchors[:, None] + off).reshape(1, -1)  # [1, A * B]
    mask = block_mask(anchors, B, length)  # [1, 1, A * B, L + A * B]
    ctx = mask[0, 0, :, :length]
    if a.no_sink:
        ctx[:, 0] = float("-inf")
    if a.no_context:
        ctx[:] = float("-inf")
    if a.window:
        ctx.masked_fill_(torch.arange(length)[None, :] <= pos[0][:, None] - a.window, float("-inf"))
    if a.context_window:
        start = anchors.repeat_interleave(B)[:, None] - a.context_window
        ctx.masked_fill_(torch.arange(length)[None, :] < start, float("-inf"))
    h, _ = draft(feats[i][None], embed[block_ids].reshape(1, -1, embed.shape[1]), torch.arange(length)[None], pos,
                 draft.empty_cache(1), mask)
    h = h.view(len(anchors), B, -1)[:, 1:]
    log_q = F.log_softmax(h @ head.t(), -1)  # [A, B - 1, V']
    rows = anchors[:, None] + off[1:] - 1
    ti, tp = top_ids[i][rows], top_p[i][rows]  # [A, B - 1, 16]
    ce = -(tp * log_q.gather(-1, ti)).sum(-1) if a.loss == "soft" else -log_q.gather(-1, ti[..., :1])[..., 0]
    if a.weights == "confidence":
        wts = confidence_weights(log_q.gather(-1, ti[..., :1])[..., 0].exp())  # [A, B - 1]
        loss = (ce * wts).sum() / wts.sum()
    else:
        wts = torch.exp(-torch.arange(B - 1, dtype=torch.float32) / a.decay)
        loss = (ce * wts).sum(-1).mean() / wts.sum()
    return loss, (log_q.argmax(-1) == ti[..., 0]).float().mean(0)


norms = [prm for prm in draft.parameters() if prm.dim() == 1]
others = [prm for prm in draft.parameters() if prm.dim() != 1]
opt = torch.optim.AdamW([{"params": others, "scale": 1.0}, {"params": norms, "scale": a.norm_lr}], lr=a.lr,
                        weight_decay=0.0)
rng = np.random.default_rng(0)
t0 = time.time()


def evaluate():
    draft.eval()
    total = torch.zeros(B - 1)
    with torch.no_grad():
        for i in held:
            total += loss_of(i, torch.arange(1, length - B + 1, 3))[1]
    draft.train()
    return (total / len(held)).numpy().round(3).tolist()


for step in range(a.steps + 1):
    if step % 50 == 0:
        print("held", step, evaluate(), round(time.time() - t0), flush=True)
    if step == a.steps:
        break
    for g in opt.param_groups:  # 20 warm-up steps
        g["lr"] = a.lr * min(1.0, (step + 1) / 20) * g["scale"]
    total, agree = 0, 0
    for i in rng.choice(train, a.batch, replace=False):
        anchors = torch.from_numpy(np.sort(rng.choice(np.arange(1, length - B + 1), a.anchors, replace=False)))
        loss, ag = loss_of(int(i), anchors)
        total, agree = total + loss / a.batch, agree + ag / a.batch
    opt.zero_grad()
    total.backward()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
    opt.step()
    if step % 25 == 0:
        print(step, round(total.item(), 3), agree.numpy().round(3).tolist(), round(time.time() - t0), flush=True)
