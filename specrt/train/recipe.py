"""`specrt train-drafter TARGET --kind eagle3|mtp|dflash`: data -> target features -> trained head -> checkpoint folder.

Conversations (ShareGPT or a JSONL file) go through the target's chat template and tokenizer, are packed
end to end and cut into sequences of `seq_len` tokens up to `max_tokens` in total; the last 5% is held back.
EAGLE-3: the draft vocabulary is the `draft_vocab` most frequent target tokens in that data (EAGLE-3's reduced
vocabulary; d2t maps it back), the head copies the target's layer shape and reads EAGLE's default layers
(2, N // 2, N - 3); the result is written in the vLLM/SGLang layout (`--drafter eagle3:OUT`). MTP: a module
over the whole vocabulary reading the last layer, written in the DeepSeek-V3 layout (`--drafter mtp:OUT`).
DFlash (train/dflash.py): trained over the whole vocabulary, written in the reference layout plus a
d2t that restricts its output to the same `draft_vocab` most frequent tokens (`--drafter dflash:OUT`).
Training (train/eagle3.py, shared) checkpoints into OUT/train and resumes from there.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from specrt.errors import SpecrtError


def _tokenize(loaded, conversations, max_tokens: int, seq_len: int) -> list[np.ndarray]:
    from specrt.convert.tokenizer import write_tokenizer
    from specrt.runtime.tokenizer import BundleTokenizer

    cfg = loaded.config
    with tempfile.TemporaryDirectory() as tmp:
        info = write_tokenizer(loaded.source.path, loaded.source.kind, Path(tmp), cfg.eos_token_ids, cfg.bos_token_id)
        tok = BundleTokenizer(Path(tmp), info.chat_template)
        stream: list[int] = []  # conversations packed end to end, then cut into sequences
        for messages in conversations:
            text = tok.render(messages, add_generation_prompt=False) if info.chat_template else \
                "\n".join(m["content"] for m in messages)
            stream.extend(tok.encode(text))
            if len(stream) >= max_tokens:
                break
    stream = stream[:max_tokens]
    seqs = [np.array(stream[lo:lo + seq_len], dtype=np.int64) for lo in range(0, len(stream) - seq_len + 1, seq_len)]
    return seqs


def head_config(target_cfg, draft_vocab: int):
    from specrt.models.eagle3 import default_aux_layers, eagle3_config_from_hf
    from specrt.models.layer_ids import write_eagle3_layers

    hf = {"hidden_size": target_cfg.hidden_size, "intermediate_size": target_cfg.intermediate_size,
          "num_attention_heads": target_cfg.num_heads, "num_key_value_heads": target_cfg.num_kv_heads,
          "head_dim": target_cfg.head_dim, "rms_norm_eps": target_cfg.rms_norm_eps, "rope_theta": target_cfg.rope.theta,
          "max_position_embeddings": target_cfg.max_position, "vocab_size": target_cfg.vocab_size,
          "draft_vocab_size": draft_vocab}
    return eagle3_config_from_hf(write_eagle3_layers(hf, default_aux_layers(target_cfg.num_layers)), target_cfg)


def _eagle3_head(loaded, draft_ids: np.ndarray):
    import torch

    from specrt.models.eagle3 import Eagle3Draft

    head = Eagle3Draft(head_config(loaded.config, len(draft_ids)))
    with torch.no_grad():
        head.d2t.copy_(torch.from_numpy(draft_ids - np.arange(len(draft_ids))))
        head.midlayer.self_attn.o_proj.weight.mul_(0.1)  # start close to "pass the fused features through"
    return head


def _mtp_head(loaded):
    """An MTP module for a target that has none: its block starts as a copy of the target's last layer, its
    output norm as the target's final norm; the lm_head and the feature norm are the target's, frozen."""
    import dataclasses

    import torch

    from specrt.models.mtp import LAYOUTS, MtpConfig, MtpModule

    t = loaded.config
    cfg = MtpConfig(dataclasses.replace(t, num_layers=1), LAYOUTS[0], own_head=True, target_layers=t.num_layers)
    head = MtpModule(cfg)
    w = loaded.weights
    with torch.no_grad():
        prefix = f"model.layers.{t.num_layers - 1}."
        head.block.load_state_dict({k: torch.from_numpy(np.array(w[prefix + k], dtype=np.float32))
                                    for k in head.block.state_dict()})
        head.head.weight.copy_(torch.from_numpy(np.array(w.get("lm_head.weight", w["model.embed_tokens.weight"]), dtype=np.float32)))
        head.target_norm.weight.copy_(torch.from_numpy(np.array(w["model.norm.weight"], dtype=np.float32)))
        head.norm.weight.copy_(head.target_norm.weight)
        head.proj.weight.mul_(0.5)
    head.head.weight.requires_grad_(False)
    head.target_norm.weight.requires_grad_(False)
    return head


def dflash_config(target_cfg, block_size: int, mask_token_id: int, layers: int = 1):
    """A DFlash drafter shaped like the target's layers, reading EAGLE's three layers (the same taps as an
    EAGLE-3 head, so one target graph serves both)."""
    from specrt.models.dflash import dflash_config_from_hf
    from specrt.models.eagle3 import default_aux_layers

    t = target_cfg
    hf = {"hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size, "num_attention_heads": t.num_heads,
          "num_key_value_heads": t.num_kv_heads, "head_dim": t.head_dim, "num_hidden_layers": layers,
          "rms_norm_eps": t.rms_norm_eps, "rope_theta": t.rope.theta, "max_position_embeddings": t.max_position,
          "vocab_size": t.vocab_size, "hidden_act": t.hidden_act,
          "dflash_config": {"target_layer_ids": list(default_aux_layers(t.num_layers)), "block_size": block_size,
                            "mask_token_id": mask_token_id}}
    return dflash_config_from_hf(hf, t)


def _dflash_trainee(loaded, block_size: int, counts: np.ndarray, layers: int = 1, init: Path | None = None,
                    frequent: int = 4096):
    """A DFlash drafter of `layers` layers. Fresh: layer i starts as a copy of one of the target's last layers
    (q/k norms at one, o_proj scaled by 0.1) and the output norm as the target's final norm, so its first outputs
    already look like the target's; the mask token is the target token least used in the training data (its
    embedding row is the mask's). From `init` (a DFlash checkpoint folder, e.g. a shipped drafter): its weights,
    block size and mask token; layers beyond its own are added after them as exact pass-throughs (a copy of the
    target's last layer with o_proj and down_proj zero), so training starts from the init drafter's outputs.
    The loss's softmax always includes the `frequent` most frequent tokens of the data (train/dflash.py)."""
    import torch

    from specrt.train.dflash import DFlashTrainee
    from specrt.models.dflash import D2T, DFlashDraft, load_dflash_checkpoint

    t, w = loaded.config, loaded.weights
    base = None
    if init is not None:
        base_cfg, base = load_dflash_checkpoint(Path(init), t)
        if base_cfg.block_size != block_size:
            raise SpecrtError(f"--init {init}: its block size is {base_cfg.block_size}, not --block-size {block_size}")
        if base_cfg.layers.num_layers > layers:
            raise SpecrtError(f"--init {init} has {base_cfg.layers.num_layers} layers, more than --layers {layers}")
        mask = base_cfg.mask_token_id
    else:
        mask = int(np.argmin(counts[1:]) + 1)  # never id 0: often a special token the template uses
    draft = DFlashDraft(dflash_config(t, block_size, mask, layers))
    if base is not None and tuple(draft.cfg.target_layer_ids) != tuple(base_cfg.target_layer_ids):
        raise SpecrtError(f"--init {init} reads target layers {list(base_cfg.target_layer_ids)}, "
                          f"not {list(draft.cfg.target_layer_ids)}")
    start = 0 if base is None else base_cfg.layers.num_layers
    with torch.no_grad():
        for i, layer in enumerate(draft.layers):
            if i < start:
                continue
            prefix = f"model.layers.{t.num_layers - max(1, layers - i) if base is None else t.num_layers - 1}."
            for name, p in layer.named_parameters():
                if prefix + name in w:
                    p.copy_(torch.from_numpy(np.array(w[prefix + name], dtype=np.float32)))
            if base is None:
                layer.self_attn.o_proj.weight.mul_(0.1)
            else:  # a pass-through until trained
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        draft.norm.weight.copy_(torch.from_numpy(np.array(w["model.norm.weight"], dtype=np.float32)))
        if base is not None:
            draft.load_state_dict({k: torch.from_numpy(v) for k, v in base.items() if k != D2T}, strict=False)
    embed = torch.from_numpy(np.array(w["model.embed_tokens.weight"], dtype=np.float32))
    head = w.get("lm_head.weight")
    lm_head = embed if head is None or t.tie_word_embeddings else torch.from_numpy(np.array(head, dtype=np.float32))
    common = torch.from_numpy(np.sort(np.argsort(-counts, kind="stable")[:frequent]))
    return DFlashTrainee(draft, embed, lm_head, common)


@dataclass(frozen=True)
class TrainingJob:
    """What `specrt train-drafter` asks for, beside the data."""

    target: str
    out: Path
    epochs: float
    batch_size: int = 4
    draft_vocab: int = 8192
    lr: float = 1e-3
    unroll: int = 3
    device: str = "cpu"
    block_size: int = 8
    seq_len: int = 256
    precision: str = "fp32"  # dflash: "bf16" trains under bf16 autocast (train/dflash.py)
    layers: int = 1  # dflash: drafter layers
    anchors: int = 64  # dflash: blocks per training sequence
    init: Path | None = None  # dflash: start from this checkpoint folder


def train_drafter(target: str, kind: str, data: str, out: Path, max_tokens: int, epochs: float, seq_len: int = 256,
                  batch_size: int = 4, draft_vocab: int = 8192, lr: float = 1e-3, unroll: int = 3, log=print,
                  device: str = "cpu", block_size: int = 8, precision: str = "fp32", layers: int = 1,
                  anchors: int = 64, init: Path | None = None) -> dict:
    """Train a drafter of this kind for the target: the shared part (data, target, draft vocabulary) here, the
    kind's own part in the trainer the registry names (specrt/drafter_kinds.py: train_eagle3, train_mtp,
    train_dflash below)."""
    from specrt import drafter_kinds
    from specrt.convert import sources
    from specrt.datasets import load_conversations

    trainable = [k.name for k in drafter_kinds.KINDS.values() if k.trainer]
    spec = drafter_kinds.KINDS.get(kind)
    if spec is None or spec.trainer is None:
        raise SpecrtError(f"train-drafter --kind {kind} is not available (available: {', '.join(trainable)})")
    job = TrainingJob(target, Path(out).expanduser(), epochs, batch_size, draft_vocab, lr, unroll, device, block_size,
                      seq_len, precision, layers, anchors, None if init is None else Path(init).expanduser())
    trainer = drafter_kinds.load_object(spec.trainer)
    trainer.check(job)
    loaded = sources.load(sources.resolve(target, log=log))
    conversations = load_conversations(None if data == "sharegpt" else data)
    seqs = _tokenize(loaded, conversations, max_tokens, seq_len)
    if not seqs:
        raise SpecrtError(f"no training sequences (the data holds fewer than {seq_len} tokens)")
    counts = np.bincount(np.concatenate(seqs), minlength=loaded.config.vocab_size)
    import torch

    torch.manual_seed(0)
    return trainer(loaded, job, seqs, counts, log)


def _draft_ids(counts: np.ndarray, size: int) -> np.ndarray:
    """The `size` most frequent target tokens of the data, sorted by id."""
    return np.sort(np.argsort(-counts, kind="stable")[:min(size, len(counts))])


def _no_check(job: TrainingJob) -> None:
    """Nothing to refuse before the target is loaded."""


def train_eagle3(loaded, job: TrainingJob, seqs, counts, log) -> dict:
    """An EAGLE-3 head over a reduced draft vocabulary, written in the vLLM/SGLang EAGLE-3 layout."""
    from specrt.models.eagle3 import save_eagle3_checkpoint, state_dict_of

    draft_ids = _draft_ids(counts, job.draft_vocab)
    return _train_head(loaded, job, seqs, counts, log, _eagle3_head(loaded, draft_ids), draft_ids, "eagle3",
                       lambda out, head: save_eagle3_checkpoint(out, head.cfg, state_dict_of(head), half=True))


def train_mtp(loaded, job: TrainingJob, seqs, counts, log) -> dict:
    """An MTP module over the whole vocabulary, written in the DeepSeek-V3 layout (convert --drafter mtp:OUT)."""
    from specrt.models.eagle3 import state_dict_of
    from specrt.models.mtp import save_mtp_checkpoint

    draft_ids = np.arange(loaded.config.vocab_size)
    return _train_head(loaded, job, seqs, counts, log, _mtp_head(loaded), draft_ids, "mtp",
                       lambda out, head: save_mtp_checkpoint(out, head.cfg, state_dict_of(head), half=True))


def _train_head(loaded, job: TrainingJob, seqs, counts, log, head, draft_ids, kind: str, save) -> dict:
    from specrt.convert.pipeline import _torch_model
    from specrt.train.eagle3 import loss_history, train

    out, unroll = job.out, job.unroll
    train_seqs, held, steps = _split(seqs, job.epochs, job.batch_size)
    log(f"{len(seqs)} sequences, {sum(len(s) for s in seqs)} tokens ({len(held)} held back); {kind} vocabulary "
        f"{len(draft_ids)} covers {counts[draft_ids].sum() / counts.sum():.1%} of the data; {steps} steps")
    target_model = _torch_model(loaded.config, loaded.weights)
    t0 = time.time()
    train(target_model, head, train_seqs, steps, out / "train", lr=job.lr, unroll=unroll,
          batch_size=job.batch_size, log=log, device=job.device,
          on_checkpoint=lambda step: log(f"step {step}: held-back top-1 by draft step "
                                         f"{[round(a, 3) for a in held_back_agreement(target_model, head, held[:16], unroll)]}"))
    agree = held_back_agreement(target_model, head, held, unroll)
    save(out, head)
    report = {"target": job.target, "sequences": len(train_seqs), "tokens": int(sum(len(s) for s in train_seqs)),
              "steps": steps, "seconds": round(time.time() - t0, 1), "held_back_top1_by_step": agree,
              "losses": loss_history(out / "train")}
    (out / "training_report.json").write_text(json.dumps(report))
    log(f"held-back top-1 agreement with the target by draft step: {[round(a, 3) for a in agree]} -> {out}")
    return report


def _split(seqs: list, epochs: float, batch_size: int) -> tuple[list, list, int]:
    """(training sequences, held-back sequences, optimizer steps). The last 5% of the stream is held back: a
    resumed run on more data never has trained on its held-back part."""
    held = seqs[-max(1, len(seqs) // 20):]
    train_seqs = seqs[:len(seqs) - len(held)] or seqs
    return train_seqs, held, max(1, int(epochs * len(train_seqs) / batch_size))


def held_back_agreement(target_model, head, held, unroll: int) -> list[float]:
    import torch

    from specrt.train.eagle3 import make_batch, unrolled_loss

    head.eval()
    sums = np.zeros(unroll)
    with torch.no_grad():
        for seq in held:
            ids = torch.from_numpy(seq[None]).to(head.target_ids().device)
            _, agree = unrolled_loss(head, make_batch(target_model, head, ids), unroll)
            sums[:len(agree)] += agree
    return (sums / len(held)).tolist()


def _check_dflash(job: TrainingJob) -> None:
    if not 2 <= job.block_size <= job.seq_len // 2:
        raise SpecrtError(f"--block-size must be between 2 and half of --seq-len ({job.seq_len // 2})")
    if job.layers < 1 or job.anchors < 1:
        raise SpecrtError("--layers and --anchors must be at least 1")
    if job.precision not in ("fp32", "bf16"):
        raise SpecrtError(f"--precision {job.precision}: fp32 or bf16")
    if job.init is not None and not (job.init / "config.json").is_file():
        raise SpecrtError(f"--init {job.init}: no DFlash checkpoint there (config.json missing)")


def train_dflash(loaded, job: TrainingJob, seqs, counts, log) -> dict:
    """Train a DFlash drafter over the whole vocabulary; the checkpoint restricts its output to the draft
    vocabulary (d2t): a few tokens lost to the drafter, most of the lm_head's cost saved at every call."""
    from specrt.convert.pipeline import _torch_model
    from specrt.train.dflash import held_back_agreement as dflash_agreement, train as train_blocks
    from specrt.train.eagle3 import loss_history
    from specrt.models.dflash import D2T, d2t_for, save_dflash_checkpoint, state_dict_of as dflash_state

    target, out, block_size, device = job.target, job.out, job.block_size, job.device
    draft_ids = _draft_ids(counts, job.draft_vocab)
    trainee = _dflash_trainee(loaded, block_size, counts, job.layers, job.init)
    train_seqs, held, steps = _split(seqs, job.epochs, job.batch_size)
    log(f"{len(seqs)} sequences, {sum(len(s) for s in seqs)} tokens ({len(held)} held back); DFlash of "
        f"{job.layers} layer(s){'' if job.init is None else f' from {job.init}'}, block {block_size}, "
        f"{job.anchors} blocks per sequence, {job.precision}, mask token {trainee.draft.cfg.mask_token_id}; draft vocabulary {len(draft_ids)} covers "
        f"{counts[draft_ids].sum() / counts.sum():.1%} of the data; {steps} steps")
    target_model = _torch_model(loaded.config, loaded.weights)
    t0 = time.time()

    def report_held(step):
        log(f"step {step}: held-back top-1 by block position {dflash_agreement(target_model, trainee, held[:8])}")

    # many blocks per sequence (64 by default): the target pass over the sequence is a large part of a step's
    # cost, so each pass feeds many blocks
    train_blocks(target_model, trainee, train_seqs, steps, out / "train", lr=job.lr, batch_size=job.batch_size,
                 anchors=job.anchors, log=log, device=device, on_checkpoint=report_held,
                 bf16=job.precision == "bf16")
    agree = dflash_agreement(target_model, trainee, held)
    save_dflash_checkpoint(out, trainee.draft.cfg, {**dflash_state(trainee.draft), D2T: d2t_for(draft_ids)})
    confidence = _confidence_head(target_model, trainee, held, draft_ids, out, job.precision == "bf16", log)
    report = {"target": target, "kind": "dflash", "sequences": len(train_seqs),
              "tokens": int(sum(len(s) for s in train_seqs)), "steps": steps, "seconds": round(time.time() - t0, 1),
              "held_back_top1_by_position": agree, "confidence_head": confidence,
              "losses": loss_history(out / "train")}
    (out / "training_report.json").write_text(json.dumps(report))
    log(f"held-back top-1 agreement with the target by block position: {agree} -> {out}")
    return report


def _confidence_head(target_model, trainee, held: list, draft_ids: np.ndarray, out: Path, bf16: bool, log) -> dict:
    """Fit the drafter's confidence head (train/confidence.py) on the first half of the held-back sequences
    (text the drafter never trained on, as at inference), score it on the second half, save it beside the
    checkpoint; returns the score."""
    from specrt.models.dflash_confidence import save_confidence_head
    from specrt.train.confidence import collect, fit, held_back_report

    half = max(1, len(held) // 2)
    fit_on, score_on = held[:half], held[half:] or held
    head = fit(collect(target_model, trainee, fit_on, draft_ids, anchors=32, seed=1, bf16=bf16))
    report = held_back_report(head, collect(target_model, trainee, score_on, draft_ids, anchors=32, seed=2, bf16=bf16))
    save_confidence_head(out, head)
    log(f"confidence head ({len(fit_on)} sequences to fit, {len(score_on)} to score): {report}")
    return report


@dataclass(frozen=True)
class Trainer:
    """A kind's trainer, as the registry names it: `check` refuses a bad job before the target is loaded."""

    train: Callable
    check: Callable = _no_check

    def __call__(self, loaded, job: TrainingJob, seqs, counts, log) -> dict:
        return self.train(loaded, job, seqs, counts, log)


EAGLE3 = Trainer(train_eagle3)
MTP = Trainer(train_mtp)
DFLASH = Trainer(train_dflash, _check_dflash)
