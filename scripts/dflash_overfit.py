"""Can the DFlash recipe memorize a handful of sequences? (issue 21: a recipe that cannot overfit is broken.)
`--kind eagle3` runs the same check on the EAGLE-3 trainer, as a control.

Trains a DFlash drafter for the default model on `--seqs` sequences of `--seq-len` tokens (the target's
features and logits computed once) and reports top-1 agreement with the target by block position on those same
sequences, over every anchor and the whole vocabulary. Switches isolate the recipe's choices:

    python scripts/dflash_overfit.py [--seqs 2] [--seq-len 64] [--steps 300] [--block 8] [--layers 1]
        [--init copy|fresh] [--loss candidates|full] [--weights confidence|decay] [--anchors all|N]
        [--leak] [--lr 1e-3] [--kind dflash|eagle3]

--leak lets each block read the features at its own anchor too (a control: slot 1 becomes nearly a linear read
of them, so it must learn fast unless features, labels and model are misaligned).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--init", choices=("copy", "fresh"), default="copy")
    ap.add_argument("--loss", choices=("candidates", "full"), default="candidates")
    ap.add_argument("--weights", choices=("confidence", "decay"), default="confidence")
    ap.add_argument("--anchors", default="all")
    ap.add_argument("--leak", action="store_true")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--kind", choices=("dflash", "eagle3"), default="dflash")
    return ap.parse_args(argv)


def _data(args):
    from specrt.catalog import DEFAULT_MODEL
    from specrt.convert import sources
    from specrt.datasets import load_conversations
    from specrt.train.recipe import _tokenize

    loaded = sources.load(sources.resolve(DEFAULT_MODEL, log=lambda *_: None))
    seqs = _tokenize(loaded, load_conversations(None), args.seqs * args.seq_len * 4, args.seq_len)[:args.seqs]
    return loaded, seqs, np.bincount(np.concatenate(seqs), minlength=loaded.config.vocab_size)


def overfit_eagle3(args: argparse.Namespace, log=print) -> list[tuple[int, list[float]]]:
    """The control: the EAGLE-3 trainer's head on the same sequences; agreement by draft step 1..3."""
    import torch

    from specrt.convert.pipeline import _torch_model
    from specrt.train.eagle3 import make_batch, unrolled_loss
    from specrt.train.recipe import _draft_ids, _eagle3_head

    torch.manual_seed(0)
    loaded, seqs, counts = _data(args)
    head = _eagle3_head(loaded, _draft_ids(counts, 8192))
    target = _torch_model(loaded.config, loaded.weights)
    batches = [make_batch(target, head, torch.from_numpy(s)[None]) for s in seqs]
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    t0, history = time.time(), []
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        total = sum(unrolled_loss(head, b)[0] for b in batches) / len(batches)
        total.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if step % args.every == 0 or step == args.steps:
            head.eval()
            with torch.no_grad():
                agree = np.mean([unrolled_loss(head, b)[1] for b in batches], axis=0).round(3).tolist()
            head.train()
            history.append((step, agree))
            log(f"step {step} ({time.time() - t0:.0f} s): loss {float(total.detach()):.3f}, top-1 by draft step {agree}")
    return history


def overfit(args: argparse.Namespace, log=print) -> list[tuple[int, list[float]]]:
    """Train as `args` says; returns (step, top-1 agreement by block position) at every evaluation."""
    import torch

    from specrt.convert.pipeline import _torch_model
    from specrt.models.dflash import DFlashDraft
    from specrt.train import dflash as T
    from specrt.train.recipe import _dflash_trainee, dflash_config

    if args.kind == "eagle3":
        return overfit_eagle3(args, log)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    loaded, seqs, counts = _data(args)
    trainee = _dflash_trainee(loaded, args.block, counts)
    if args.layers != 1 or args.init == "fresh":
        cfg = dflash_config(loaded.config, args.block, trainee.draft.cfg.mask_token_id, args.layers)
        draft = DFlashDraft(cfg)
        for name, p in draft.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        trainee.draft = draft
    if args.loss == "full":
        trainee.frequent = None
    if args.weights == "decay":
        T.confidence_weights = lambda q: torch.exp(-torch.arange(q.shape[1], dtype=q.dtype) / 4.0).expand_as(q)
    if args.leak:
        base = T.block_mask
        T.block_mask = lambda anchors, block, ctx_len: base(anchors + 1, block, ctx_len)
    target = _torch_model(loaded.config, loaded.weights)
    cfg = trainee.draft.cfg
    data = []
    for s in seqs:
        ids = torch.from_numpy(s)
        feats, logits = T.target_pass(target, ids[None], cfg.target_layer_ids)
        data.append((ids, feats[0], logits[0]))
    all_anchors = torch.arange(1, args.seq_len - args.block + 1)
    opt = torch.optim.AdamW(trainee.draft.parameters(), lr=args.lr, weight_decay=0.0)
    log(f"{args}: mask token {cfg.mask_token_id}, {len(all_anchors)} anchors per sequence")

    def evaluate() -> list[float]:
        trainee.eval()
        agree = np.zeros(args.block - 1)
        with torch.no_grad():
            for ids, feats, logits in data:
                agree += T.block_loss(trainee, ids, feats, logits, all_anchors, None)[1]
        trainee.train()
        return (agree / len(data)).round(3).tolist()

    t0, history = time.time(), []
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        total = 0.0
        for ids, feats, logits in data:
            anchors = all_anchors if args.anchors == "all" else torch.from_numpy(
                T.pick_anchors(rng, args.seq_len, args.block, int(args.anchors)))
            candidates = T.loss_candidates(logits[None], trainee.frequent)
            loss, _ = T.block_loss(trainee, ids, feats, logits, anchors, candidates)
            total = total + loss / len(data)
        total.backward()
        torch.nn.utils.clip_grad_norm_(trainee.draft.parameters(), 1.0)
        opt.step()
        if step % args.every == 0 or step == args.steps:
            history.append((step, evaluate()))
            log(f"step {step} ({time.time() - t0:.0f} s): loss {float(total.detach()):.3f}, top-1 by position "
                f"{history[-1][1]}")
    return history


if __name__ == "__main__":
    overfit(parse())
