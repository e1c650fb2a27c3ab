"""Validation of a mixture of experts follows the graph's choice of experts where two nearly tie.

Two correct implementations may pick either of two experts whose router scores tie to rounding, and in a deep
model one swap moves every later logit (a 30-layer Gemma 4 26B-A4B differed from torch by 9 after one), so the
torch reference takes the graph's pick where it is a near-tie (models/moe.py ExpertChoice) and refuses a graph
whose pick is not one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from specrt.bundle import load_bundle
from specrt.cli import main
from specrt.convert import pipeline
from specrt.models.moe import ROUTE_TIE, ExpertChoice
from tests.tiny_models import assert_refused_in_one_line, save_tiny_bundle_source


def test_a_followed_near_tie_is_taken_and_counted():
    probs = torch.tensor([[0.4, 0.3, 0.3 * (1 - 1e-6), 0.0]])  # experts 1 and 2 tie to a millionth
    choice = ExpertChoice()
    assert choice(probs, 2)[1].tolist() == [[0, 1]]
    choice.follow = torch.tensor([[2, 0]])
    weights, ids = choice(probs, 2)
    assert ids.tolist() == [[2, 0]] and torch.equal(weights, probs[:, [2, 0]])
    assert (choice.followed, choice.refused) == (1, []) and choice.follow is None


def test_a_followed_choice_beyond_a_near_tie_is_refused():
    probs = torch.softmax(torch.tensor([[2.0, 1.0, 0.0, -1.0]]), dim=-1)
    choice = ExpertChoice()
    choice.follow = torch.tensor([[0, 2]])  # expert 2 scores a whole logit below expert 1
    choice(probs, 2)
    assert choice.followed == 1 and len(choice.refused) == 1 and choice.refused[0][1] > ROUTE_TIE
    choice.follow = torch.tensor([[1, 0]])  # the same set in another order: nothing followed
    choice(probs, 2)
    assert choice.followed == 1 and len(choice.refused) == 1


@pytest.fixture(scope="module")
def twin_experts(tmp_path_factory):
    """A tiny Qwen3-MoE whose experts 0 and 1 are the same expert with the same router row in every layer: a
    token may route to either, exactly tied."""
    src = save_tiny_bundle_source("qwen3_moe", tmp_path_factory.mktemp("moe_validation") / "src")
    tensors = load_file(str(src / "model.safetensors"))
    for name in list(tensors):
        if name.endswith(".mlp.gate.weight"):
            tensors[name][1] = tensors[name][0]
        elif ".mlp.experts.1." in name:
            tensors[name] = tensors[name.replace(".experts.1.", ".experts.0.")].copy()
    save_file(tensors, str(src / "model.safetensors"))
    return src


def _routes_changed(monkeypatch, change):
    """Make conversion's run of the graph report routes changed by change(routes) (per prompt {layer: [S, k]})."""
    real = pipeline.run_graph

    def run_graph(*args, **kwargs):
        outputs, routes = real(*args, **kwargs)
        return outputs, change(routes)

    monkeypatch.setattr(pipeline, "run_graph", run_graph)


def _swap_twins(routes):
    """Expert 0 for expert 1 and back: the other side of an exact tie, the same output."""
    return [{layer: np.where(ids == 0, 1, np.where(ids == 1, 0, ids)) for layer, ids in r.items()} for r in routes]


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_the_reference_follows_the_graph_across_exact_ties(twin_experts, tmp_path, monkeypatch, precision):
    _routes_changed(monkeypatch, _swap_twins)
    out = tmp_path / precision
    assert main(["convert", str(twin_experts), "-o", str(out), "--precision", precision, "--max-context", "96"]) == 0
    validation = load_bundle(out).provenance["validation"]
    routing = validation["routing"]
    assert 0 < routing["followed_near_ties"] <= routing["token_layers"]
    checked = validation["quantized_reference" if precision == "int4" else "source"]
    assert checked["max_abs_diff"] < 1e-3 and checked["top1_agreement"] == 1.0


def test_a_graph_routing_beyond_near_ties_is_refused(twin_experts, tmp_path, monkeypatch, capsys):
    def misroute(routes):  # every token of the first prompt in the first MoE layer sent to experts 6 and 7
        first = min(routes[0])
        routes[0][first] = np.broadcast_to(np.array([6, 7]), routes[0][first].shape).copy()
        return routes

    _routes_changed(monkeypatch, misroute)
    out = tmp_path / "refused"
    assert_refused_in_one_line(["convert", str(twin_experts), "-o", str(out), "--max-context", "96"], out, capsys,
                               r"the graph chooses other experts than the torch reference at \d+ of \d+ token-layers "
                               r"\(worst: layer \d+, validation prompt 0")
