"""Training an EAGLE-3 head on a tiny target: the loss falls, and an interrupted run resumes exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specrt.train.eagle3 import train
from specrt.models.eagle3 import Eagle3Draft, eagle3_config_from_hf
from specrt.models.transformer import CausalLM
from tests.test_eagle3 import HEAD_HF, TARGET
from tests.tiny_models import hf_model


def tiny_target() -> CausalLM:
    model = CausalLM(TARGET).eval()
    model.load_state_dict(hf_model("llama").state_dict(), strict=False)
    return model


def fresh_head() -> Eagle3Draft:
    torch.manual_seed(0)
    return Eagle3Draft(eagle3_config_from_hf({**HEAD_HF, "draft_vocab_size": 97}, TARGET))


def sequences(n=16, length=24):
    rng = np.random.default_rng(0)
    return [rng.integers(5, 97, size=length) for _ in range(n)]


def test_loss_falls(tmp_path):
    losses = train(tiny_target(), fresh_head(), sequences(), steps=40, folder=tmp_path, lr=3e-3, log=lambda m: None)
    assert np.mean(losses[-5:]) < 0.3 * np.mean(losses[:5])  # KL to the target: 0.18 -> 0.01 when measured


def test_interrupted_training_resumes_where_it_stopped(tmp_path):
    target, data = tiny_target(), sequences()
    whole = fresh_head()
    train(target, whole, data, steps=8, folder=tmp_path / "whole", log=lambda m: None, save_every=4)

    def interrupt_at_step_6(message):  # Ctrl-C during step 6: steps 5 and 6 are lost, step 4's checkpoint is not
        if message.startswith("step 6/"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(target, fresh_head(), data, steps=8, folder=tmp_path / "part", log=interrupt_at_step_6, save_every=4)
    resumed_head = fresh_head()  # a new process: only the checkpoint carries the state
    rest = train(target, resumed_head, data, steps=8, folder=tmp_path / "part", log=lambda m: None, save_every=4)
    assert len(rest) == 4
    for (name, a), b in zip(whole.state_dict().items(), resumed_head.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def write_conversations(path, n: int = 30) -> None:
    """A JSONL file of n two-turn conversations over the tiny tokenizer's words."""
    words = "the cat and the dog in the house of the world is a man with a child".split()
    rng = np.random.default_rng(0)
    lines = [json.dumps({"messages": [{"role": "user", "content": " ".join(rng.choice(words, 12))},
                                      {"role": "assistant", "content": " ".join(rng.choice(words, 40))}]})
             for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")


def test_train_drafter_command_writes_a_checkpoint_convert_reads(tmp_path, capsys):
    """specrt train-drafter on a tiny HF model and a JSONL file, then convert --drafter eagle3 with the result."""

    from specrt.bundle import load_bundle
    from specrt.cli import main
    from tests.tiny_models import save_tiny_bundle_source

    src = save_tiny_bundle_source("llama", tmp_path / "target")
    write_conversations(tmp_path / "data.jsonl")
    head = tmp_path / "head"
    code = main(["train-drafter", str(src), "--data", str(tmp_path / "data.jsonl"), "--out", str(head),
                 "--max-tokens", "1500", "--epochs", "2", "--seq-len", "64"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((head / "training_report.json").read_text())
    assert report["steps"] >= 2 and len(report["held_back_top1_by_step"]) == 3
    assert (head / "train" / "train_state.safetensors").is_file()  # what a resumed run starts from
    bundle = tmp_path / "bundle"
    assert main(["convert", str(src), "-o", str(bundle), "--max-context", "64", "--drafter", f"eagle3:{head}"]) == 0
    assert load_bundle(bundle).drafter("eagle3").draft_vocab_size <= 97


def test_conversation_files_are_checked(tmp_path):
    import pytest

    from specrt.datasets import load_conversations
    from specrt.errors import SpecrtError

    f = tmp_path / "c.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"other": 1}\n')
    with pytest.raises(SpecrtError, match='record 2 has neither "messages" nor "text"'):
        load_conversations(f)
    with pytest.raises(SpecrtError, match="no such conversations file"):
        load_conversations(tmp_path / "missing.jsonl")


def test_unusable_training_device_is_refused(tmp_path, capsys):
    from specrt.cli import main

    code = main(["train-drafter", "smollm2-135m-instruct", "--out", str(tmp_path / "o"), "--device", "cuda:7"])
    err = capsys.readouterr().err
    assert code == 2 and "--device cuda:7: not usable here" in err and err.strip().count("\n") == 0
    assert not (tmp_path / "o").exists()
