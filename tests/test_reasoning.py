"""runtime/reasoning.py: a thought told apart from the answer, whole (split) and streamed (ThoughtParser) alike, for
any chunking of the answer; no thought marker left in the answer."""

from __future__ import annotations

import pytest

from specrt.runtime.reasoning import GEMMA_CHANNEL, THINK, ThoughtParser, split

ANSWERS = [
    (THINK, True, "I'm\nthinking\n</think>\n\nHello, world!"),
    (THINK, False, "<think>\nI'm\nthinking\n</think>\n\nHello, world!"),
    (THINK, False, "No thought at all.\nJust words."),
    (THINK, True, "a thought cut off by the token limit"),
    (THINK, False, "Stray </think> closer"),
    (GEMMA_CHANNEL, False, "<|channel>thought\nI'm\nthinking<channel|>Hello, world!"),
    (GEMMA_CHANNEL, False, "<|channel>thought\n<channel|>Hello, world!<channel|>"),
    (GEMMA_CHANNEL, False, "<|channel><|channel>thought\n<channel|>Hello, world!"),
    (GEMMA_CHANNEL, False, "<|channel>thought\n<channel|>Hello!<|channel>thought\nmore<channel|>"),
    (GEMMA_CHANNEL, False, "<|channel>thou"),
]


@pytest.mark.parametrize("style, open_thought, answer", ANSWERS)
def test_streamed_split_is_the_whole_split_for_any_chunking(style, open_thought, answer):
    thought, content = split(answer, style, open_thought)
    assert style.open not in content and style.close not in content
    for size in (1, 2, 3, 5, 8, len(answer)):
        parser = ThoughtParser(style, open_thought)
        pieces = [p for i in range(0, len(answer), size) for p in parser.feed(answer[i:i + size])] + parser.finish()
        assert "".join(p.text for p in pieces if p.reasoning) == thought, size
        assert "".join(p.text for p in pieces if p.content) == content, size


def test_an_unclosed_thought_ends_at_a_call_when_read_whole():
    """A model may call without closing its thought (llama.cpp reads it so); with the closer written, a call's
    opener inside the thought is thought."""
    assert split("Need it.\n<tool_call>x", THINK, True, ("<tool_call>",)) == ("Need it.\n", "<tool_call>x")
    assert split("Maybe <tool_call>x</think>\n\nNo.", THINK, True, ("<tool_call>",)) == ("Maybe <tool_call>x", "No.")
