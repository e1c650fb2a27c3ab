"""The torch reference definition against transformers, and its KV cache and tree mask."""

from __future__ import annotations

import pytest
import torch

from specrt.models.config import config_from_hf
from specrt.models.transformer import CausalLM
from tests.tiny_models import ARCHS, hf_model


def ours_from(hf) -> CausalLM:
    model = CausalLM(config_from_hf(hf.config.to_dict())).eval()
    missing, unexpected = model.load_state_dict(hf.state_dict(), strict=False)
    assert not unexpected
    assert all(k == "lm_head.weight" for k in missing)  # only the tied head may be absent
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_torch_definition_equals_transformers(arch):
    hf = hf_model(arch)
    ours = ours_from(hf)
    ids = torch.randint(0, hf.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        got, _, taps = ours(ids, hidden_layers=(0, 1))
    assert (ref.logits - got).abs().max().item() <= 1e-4
    h = hf.config.hidden_size
    # HF hidden_states[i + 1] is the residual stream after layer i (its last entry is normed, so not used)
    assert torch.allclose(taps[..., :h], ref.hidden_states[1], atol=1e-4)
    assert torch.allclose(taps[..., h:], ref.hidden_states[2], atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cache_decode_equals_full_forward(arch):
    ours = ours_from(hf_model(arch))
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full, _, _ = ours(ids)
        pieces, past = [], None
        for lo, hi in ((0, 5), (5, 6), (6, 9), (9, 12)):
            logits, past, _ = ours(ids[:, lo:hi], past=past)
            pieces.append(logits)
    assert (torch.cat(pieces, 1) - full).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_tree_mask_equals_separate_chains(arch):
    """Tokens b and c both follow a: one call with a tree mask = two chain calls."""
    ours = ours_from(hf_model(arch))
    prefix = torch.tensor([[5, 17, 23, 42]])
    a, b, c = 7, 11, 13
    with torch.no_grad():
        _, past, _ = ours(prefix)
        chain_b, _, _ = ours(torch.tensor([[a, b]]), past=past)
        chain_c, _, _ = ours(torch.tensor([[a, c]]), past=past)
        p = prefix.shape[1]
        bias = torch.zeros(1, 1, 3, p + 3)
        bias[0, 0, 2, p + 1] = float("-inf")  # c does not see its sibling b
        positions = torch.tensor([[p, p + 1, p + 1]])
        tree, _, _ = ours(torch.tensor([[a, b, c]]), position_ids=positions, past=past, attention_bias=bias)
    assert (tree[0, 1] - chain_b[0, 1]).abs().max().item() <= 1e-4
    assert (tree[0, 2] - chain_c[0, 1]).abs().max().item() <= 1e-4
    assert (tree[0, 0] - chain_b[0, 0]).abs().max().item() <= 1e-4
