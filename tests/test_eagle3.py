"""The EAGLE-3 head's torch definition and its vLLM/SGLang checkpoint layout, on tiny random weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from specrt.errors import SourceError
from specrt.models.config import config_from_hf
from specrt.models.eagle3 import (
    Eagle3Draft, default_aux_layers, eagle3_config_from_hf, load_eagle3_checkpoint, model_from_tensors,
    save_eagle3_checkpoint, state_dict_of,
)
from tests.tiny_models import COMMON

TARGET = config_from_hf({**COMMON, "model_type": "llama", "rope_theta": 10000.0})
HEAD_HF = {**COMMON, "num_hidden_layers": 1, "draft_vocab_size": 40, "rope_theta": 10000.0}


def random_head(seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    model = Eagle3Draft(eagle3_config_from_hf(HEAD_HF, TARGET)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        # draft ids map to a spread of target ids (d2t holds offsets: target = d + d2t[d])
        model.d2t.copy_(torch.from_numpy(np.sort(np.random.default_rng(seed).choice(97, 40, replace=False))) - torch.arange(40))
    return model


def test_default_aux_layers_follow_eagle():
    assert default_aux_layers(30) == (2, 15, 27)
    assert eagle3_config_from_hf(HEAD_HF, TARGET).aux_layers == (2, 1, 0)  # a 3-layer target


@pytest.mark.parametrize("layout", ["midlayer", "layers.0"])
def test_checkpoint_round_trip_and_forward(tmp_path, layout):
    head = random_head()
    save_eagle3_checkpoint(tmp_path, head.cfg, state_dict_of(head))
    if layout == "layers.0":  # SGLang/vLLM also accept layers.0.* names
        path = tmp_path / "model.safetensors"
        tensors = load_file(str(path))
        save_file({k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}, str(path))
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForCausalLMEagle3"] and hf["draft_vocab_size"] == 40
    cfg, tensors = load_eagle3_checkpoint(tmp_path, TARGET)
    for name, value in state_dict_of(head).items():
        np.testing.assert_array_equal(tensors[name], value)
    assert tensors["t2d"].sum() == 40 and tensors["t2d"][head.target_ids().numpy()].all()
    loaded = model_from_tensors(cfg, tensors)
    emb, feats = torch.randn(1, 5, 64), torch.randn(1, 5, 3 * 64)
    pos = torch.arange(5)[None]
    empty = torch.zeros(1, 2, 0, 16)
    with torch.no_grad():
        a = head(emb, head.fuse(feats), pos, empty, empty)
        b = loaded(emb, loaded.fuse(feats), pos, empty, empty)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert a[0].shape == (1, 5, 40) and a[1].shape == (1, 5, 64)


def test_incremental_steps_equal_one_call():
    """Feeding tokens one at a time through the head's own KV cache equals one call over all of them."""
    head = random_head(1)
    emb, hidden = torch.randn(1, 6, 64), torch.randn(1, 6, 64)
    pos = torch.arange(6)[None]
    with torch.no_grad():
        full_logits, full_h, _, _ = head(emb, hidden, pos, torch.zeros(1, 2, 0, 16), torch.zeros(1, 2, 0, 16))
        k = v = torch.zeros(1, 2, 0, 16)
        for i in range(6):
            logits, h, nk, nv = head(emb[:, i:i + 1], hidden[:, i:i + 1], pos[:, i:i + 1], k, v)
            k, v = torch.cat((k, nk), 2), torch.cat((v, nv), 2)
            torch.testing.assert_close(logits[:, 0], full_logits[:, i], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(h[:, 0], full_h[:, i], rtol=1e-5, atol=1e-5)


def _write(tmp_path, head, hf_changes=None, drop=None, add=None, d2t=None):
    tensors = state_dict_of(head)
    if drop:
        tensors.pop(drop)
    if add:
        tensors[add] = np.zeros(3, np.float32)
    if d2t is not None:
        tensors["d2t"] = d2t
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**head.cfg.to_hf(), **(hf_changes or {})}))


@pytest.mark.parametrize("kwargs, message", [
    (dict(drop="midlayer.hidden_norm.weight"), "lacks tensor midlayer.hidden_norm.weight"),
    (dict(add="midlayer.extra.weight"), "unexpected tensor midlayer.extra.weight"),
    (dict(d2t=np.full(40, 90, dtype=np.int64)), "d2t maps draft id 7 to target id 97"),
    (dict(hf_changes={"target_hidden_size": 128}), "reads hidden size 128, the target has 64"),
    (dict(hf_changes={"vocab_size": 151936}), "vocabulary 151936, the target has 97"),
    (dict(hf_changes={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 30]}}), "reads layers [1, 2, 30]"),
])
def test_bad_checkpoints_are_named(tmp_path, kwargs, message):
    _write(tmp_path, random_head(), **kwargs)
    with pytest.raises(SourceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_eagle3_checkpoint(tmp_path, TARGET)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(random_head().cfg.to_hf()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(SourceError, match="pytorch_model.bin is a pickle file"):
        load_eagle3_checkpoint(tmp_path, TARGET)


def test_onnx_graph_equals_torch_over_steps():
    """The exported head (fused ORT operators, own KV cache) equals its torch definition: a 4-token call
    from target features, then two single-token steps that feed back the head's own hidden output."""
    import onnxruntime as ort

    from specrt.convert.eagle3_graph import build_eagle3_graph
    from specrt.convert.target_graph import GraphOptions

    head = random_head(2)
    embed = np.random.default_rng(0).normal(size=(97, 64)).astype(np.float32)
    model = build_eagle3_graph(head.cfg, state_dict_of(head), embed, GraphOptions(max_context=32))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    max_ctx, rng = 32, np.random.default_rng(1)
    past_k = np.zeros((1, 2, max_ctx, 16), np.float32)
    past_v = np.zeros_like(past_k)
    tk = tv = torch.zeros(1, 2, 0, 16)
    ids = rng.integers(0, 97, size=(1, 6))
    feats = rng.normal(size=(1, 4, 192)).astype(np.float32)
    hidden = None
    for start, n, use in ((0, 4, True), (4, 1, False), (5, 1, False)):
        tokens = ids[:, start:start + n]
        pos = np.arange(start, start + n)[None]
        f = feats if use else np.zeros((1, n, 192), np.float32)
        h_in = hidden if hidden is not None and not use else np.zeros((1, n, 64), np.float32)
        logits, h_out, past_k, past_v = sess.run(None, {
            "input_ids": tokens, "position_ids": pos, "attention_mask": np.ones((1, start + n), np.int64),
            "attention_bias": np.zeros((1, 1, n, start + n), np.float32), "features": f, "hidden": h_in,
            "use_features": np.array([use]), "past_key_values.0.key": past_k, "past_key_values.0.value": past_v})
        with torch.no_grad():
            emb = torch.from_numpy(embed[tokens])
            hid = head.fuse(torch.from_numpy(f)) if use else torch.from_numpy(h_in)
            t_logits, t_h, k, v = head(emb, hid, torch.from_numpy(pos), tk, tv)
        tk, tv = torch.cat((tk, k), 2), torch.cat((tv, v), 2)
        np.testing.assert_allclose(logits, t_logits.numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(h_out, t_h.numpy(), atol=1e-4, rtol=1e-4)
        hidden = h_out[:, -1:]
