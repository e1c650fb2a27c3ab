"""A reasoning model's thought, told apart from its answer: `<think>...</think>` (Qwen3, Qwen3.5, QwQ, DeepSeek-R1)
and Gemma 4's thought channel (`<|channel>thought\\n...<channel|>`); gpt-oss's channels are runtime/harmony.py's.

The thought goes out as `reasoning_content` (what llama.cpp's `reasoning_format` and vLLM's reasoning parsers give),
the rest as the answer's content, with no thought marker left in it. A prompt may leave the thought open (Qwen3.5
with thinking on ends it with `<think>\\n`): the answer then starts inside the thought. `split` reads a whole
answer, ThoughtParser one streamed chunk at a time (holding back text that may be the start of a marker).
"""

from __future__ import annotations

from dataclasses import dataclass

from specrt.runtime.harmony import Piece, REASONING, partial_marker

FINAL = "final"  # the channel of answer text (as harmony names it)


@dataclass(frozen=True)
class ThoughtStyle:
    open: str
    close: str
    label: str = ""  # a channel name written after the opener (Gemma's "thought"), not part of the thought


THINK = ThoughtStyle("<think>", "</think>")
GEMMA_CHANNEL = ThoughtStyle("<|channel>", "<channel|>", "thought")


def style_of(template: str | None) -> ThoughtStyle | None:
    """The thought markers a chat template writes, or None (gpt-oss's harmony is told by its vocabulary)."""
    if not template:
        return None
    if "<|channel>" in template and "<channel|>" in template:
        return GEMMA_CHANNEL
    if "</think>" in template:
        return THINK
    return None


def prompt_leaves_open(style: ThoughtStyle | None, prompt: str) -> bool:
    """The rendered prompt ends inside a thought: the answer starts with the model's reasoning."""
    return style is not None and prompt.rfind(style.open) > prompt.rfind(style.close)


def _unlabel(style: ThoughtStyle, thought: str) -> str:
    """A thought's text without its channel label ("thought" and the newline after it), from the last opener in it
    (Gemma 4 may open its channel twice)."""
    if style.label:
        thought = thought.rsplit(style.open, 1)[-1]
    if style.label and thought.startswith(style.label):
        thought = thought[len(style.label):]
        return thought[1:] if thought.startswith("\n") else thought
    return thought


def split(text: str, style: ThoughtStyle | None, open_thought: bool = False, ends: tuple[str, ...] = ()
          ) -> tuple[str, str]:
    """A whole answer -> (reasoning, the rest with no thought marker in it). Every thought span goes to the reasoning;
    a thought the prompt left open, or one never closed, runs to its closer, else to the first of `ends` (a tool
    call's opener: a model may call without closing its thought), else to the answer's end. Markers inside a thought
    (a call's opener before the closer) are thought, not answer."""
    if style is None:
        return "", text
    reasoning, rest, at, inside = [], [], 0, open_thought
    while at <= len(text):
        if inside:
            close = text.find(style.close, at)
            if close < 0:
                end = min((i for e in ends if (i := text.find(e, at)) >= 0), default=len(text))
                reasoning.append(_unlabel(style, text[at:end]))
                at = end
                inside = False
                if end == len(text):
                    break
                continue
            reasoning.append(_unlabel(style, text[at:close]))
            at, inside = close + len(style.close), False
            continue
        start = text.find(style.open, at)
        if start < 0:
            rest.append(text[at:])
            break
        rest.append(text[at:start])
        at, inside = start + len(style.open), True
    content = "".join(rest).replace(style.close, "")  # a stray closer (Gemma's `<channel|>` after its answer)
    return "".join(reasoning), content.lstrip() if reasoning or open_thought else content


class ThoughtParser:
    """Incremental split: feed() text chunks, get Pieces (channel "analysis" for the thought, "final" for the
    answer, as runtime/harmony.py's parser gives); markers never come out. Whitespace that opens the answer after
    a thought is dropped (the template's "\\n\\n" after `</think>`)."""

    def __init__(self, style: ThoughtStyle, in_thought: bool = False):
        self.style, self.inside = style, in_thought
        self.pending = ""
        self.after_thought = in_thought  # the answer's leading whitespace still to drop
        self.label_seen = not (in_thought and style.label)  # the channel label still to drop

    def feed(self, chunk: str) -> list[Piece]:
        text, out = self.pending + chunk, []
        self.pending = ""
        while text:
            marker = self.style.close if self.inside else self.style.open
            at = text.find(marker)
            stray = -1 if self.inside else text.find(self.style.close)  # a closer with no opener: dropped
            if 0 <= stray and (at < 0 or stray < at):
                self._take(text[:stray], out)
                text = text[stray + len(self.style.close):]
                continue
            if at < 0:
                keep = partial_marker(text, (marker,) if self.inside else (self.style.open, self.style.close))
                head = _past(text, self.style.open) if self.inside and not self.label_seen else None
                if head is not None and (len(head) < len(self.style.label) + 1 or self.style.open.startswith(head)):
                    keep = len(text)  # the label (after the opener, written again or not) may still be arriving
                self._take(text[:len(text) - keep], out)
                self.pending = text[len(text) - keep:]
                break
            self._take(text[:at], out)
            text = text[at + len(marker):]
            self.inside = not self.inside
            if self.inside:
                self.label_seen = not self.style.label
            else:
                self.after_thought = True
        return out

    def finish(self) -> list[Piece]:
        rest, self.pending, out = self.pending, "", []
        self.label_seen = self.label_seen or not self.inside
        if self.inside and not self.label_seen:
            rest = _unlabel(self.style, rest)
        self._take(rest, out)
        return out

    def _take(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self.inside:
            if not self.label_seen:
                text, self.label_seen = _unlabel(self.style, text), True
            if text:
                out.append(Piece(REASONING, text))
            return
        if self.after_thought:
            text = text.lstrip()
            self.after_thought = not text
        if text:
            out.append(Piece(FINAL, text))


def _past(text: str, opener: str) -> str:
    """text after the openers it starts with."""
    while text.startswith(opener):
        text = text[len(opener):]
    return text


class InlineParser:
    """reasoning_format none: the answer's text as it comes, thought and markers included, after the thought marker
    the prompt left open (llama.cpp gives the same content); `inner`, a harmony parser, has its analysis written
    back as `<|channel|>analysis<|message|>...<|end|>` around the final text."""

    def __init__(self, prefix: str = "", inner=None):
        self.prefix, self.inner, self.in_thought = prefix, inner, False

    def feed(self, chunk: str) -> list[Piece]:
        return self._text(self.inner.feed(chunk) if self.inner is not None else [Piece(FINAL, chunk)])

    def finish(self) -> list[Piece]:
        pieces = self._text(self.inner.finish() if self.inner is not None else [])
        if self.in_thought:
            pieces.append(Piece(FINAL, "<|end|>"))
            self.in_thought = False
        return pieces

    def _text(self, pieces: list[Piece]) -> list[Piece]:
        out = []
        for p in pieces:
            if not (p.reasoning or p.content):
                continue
            text = p.text
            if p.reasoning and not self.in_thought:
                text = "<|channel|>analysis<|message|>" + text
            elif not p.reasoning and self.in_thought:
                text = "<|end|>" + text
            self.in_thought = p.reasoning
            out.append(Piece(FINAL, self.prefix + text))
            self.prefix = ""
        return out
