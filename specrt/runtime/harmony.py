"""gpt-oss's harmony format: split a streamed answer into its channels (analysis = reasoning, final = the answer).

A harmony answer is a run of messages, each `<|start|>HEADER<|message|>CONTENT` ended by `<|end|>` (more follow),
`<|return|>` (the last one) or `<|call|>` (a tool call); the header names the role, `<|channel|>analysis | commentary
| final`, for a tool call ` to=functions.NAME` and `<|constrain|>json`. The prompt ends inside the first header
(`<|start|>assistant`), so the generated text starts with `<|channel|>analysis<|message|>`. These markers are
special tokens: the engine keeps them in the text of a bundle whose vocabulary has them (runtime/tokenizer.py
`harmony`), and this parser turns that text, chunk by chunk as it streams, into (channel, text) pieces. Known
limit: it reads the text, so a marker's spelling written with ordinary tokens (an answer explaining harmony)
reads as the marker; telling them apart needs the token ids.
"""

from __future__ import annotations

from dataclasses import dataclass

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>")
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)
VOCAB_MARKERS = (START, CHANNEL, MESSAGE, "<|end|>")  # a vocabulary with all of these speaks harmony
ANSWER_ENDS = ("<|return|>", "<|call|>")  # an answer ends here (the last message, or a tool call); <|end|> does not
REASONING = "analysis"  # the channel shown apart as thinking; final and commentary are the answer
REASONING_EFFORTS = ("low", "medium", "high")  # the chat template's reasoning_effort ("Reasoning: low")


@dataclass(frozen=True)
class Piece:
    channel: str  # analysis, final, commentary (or whatever the header named)
    text: str
    recipient: str | None = None  # a tool call's "functions.NAME" (header " to=...")

    @property
    def kind(self) -> str:
        """call (to a function: `functions.NAME`), builtin (to one of gpt-oss's own tools, `browser.search`,
        `python`, `container.exec`: neither the answer nor its reasoning), reasoning (the analysis channel) or
        content."""
        if self.recipient and self.recipient.startswith("functions."):
            return "call"
        if self.recipient not in (None, "assistant"):
            return "builtin"
        return "reasoning" if self.channel == REASONING else "content"

    @property
    def reasoning(self) -> bool:
        return self.kind == "reasoning"

    @property
    def content(self) -> bool:
        return self.kind == "content"


def _header_fields(header: str) -> tuple[str, str | None]:
    """'assistant<|channel|>commentary to=functions.f <|constrain|>json' -> ('commentary', 'functions.f'); the
    recipient may also come before the channel ('assistant to=functions.f<|channel|>commentary')."""
    head = header.split(CONSTRAIN)[0]
    after = head.rsplit(CHANNEL, 1)[1].split() if CHANNEL in head else []  # the last channel named counts
    channel = after[0] if after else "final"
    recipient = next((w[3:] for w in head.replace(CHANNEL, " ").split() if w.startswith("to=")), None)
    return channel, recipient


class HarmonyParser:
    """Incremental: feed() text chunks (the engine's stream), get Pieces of message content; marker text never
    comes out, and text that may be the start of a marker is held back until the next chunk says."""

    def __init__(self, in_header: bool = True):
        self.state = "header" if in_header else "between"  # header | content | between (after an end marker)
        self.header = ""
        self.channel, self.recipient = "final", None
        self.pending = ""

    def feed(self, chunk: str) -> list[Piece]:
        text, at, out = self.pending + chunk, 0, []
        # each marker's next place at or after `at` (-1: none), searched again only once `at` has passed it: the
        # text is model output, and searching the rest of it again after every marker (slicing it off each time)
        # took seconds on 100 KB of markers
        ahead = {m: text.find(m) for m in MARKERS}
        while True:
            for m, place in ahead.items():
                if 0 <= place < at:
                    ahead[m] = text.find(m, at)
            cut, marker = min(((place, m) for m, place in ahead.items() if place >= 0), default=(-1, ""))
            if cut < 0:
                break
            self._take(text[at:cut], out)
            at = cut + len(marker)
            self._marker(marker)
        rest = text[at:]
        keep = partial_marker(rest)
        self._take(rest[:len(rest) - keep], out)
        self.pending = rest[len(rest) - keep:]
        return out

    def finish(self) -> list[Piece]:
        """What is still held back (an answer cut off by its token limit may end in part of a marker)."""
        rest, self.pending = self.pending, ""
        out: list[Piece] = []
        self._take(rest, out)
        return out

    def _take(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self.state == "header":
            self.header += text
        elif self.state == "content":
            out.append(Piece(self.channel, text, self.recipient))
        # between messages: stray text (none in a well-formed answer) is dropped

    def _marker(self, marker: str) -> None:
        if marker == START:
            self.state, self.header = "header", ""
        elif marker in (CHANNEL, CONSTRAIN):
            if self.state == "header":
                self.header += marker
        elif marker == MESSAGE:
            if self.state == "header":
                self.channel, self.recipient = _header_fields(self.header)
                self.state = "content"
        else:  # an end marker
            self.state, self.header = "between", ""


def partial_marker(text: str, markers=MARKERS, within: int | None = None) -> int:
    """Characters at the end of text (of its last `within` at most) that could begin one of the markers: what a
    streaming reader holds back until the next chunk says (also runtime/reasoning.py's and the tool calls'
    CallContent's)."""
    most = min(len(text) if within is None else within, max(map(len, markers)))
    return max((k for k in range(1, most + 1) if any(m.startswith(text[-k:]) for m in markers)), default=0)


def split(text: str, in_header: bool = True) -> tuple[str, str]:
    """A whole harmony answer -> (reasoning, answer): the analysis channel's text, and the final and commentary
    channels' text joined (messages to a tool are neither)."""
    parser = HarmonyParser(in_header)
    pieces = parser.feed(text) + parser.finish()
    return ("".join(p.text for p in pieces if p.reasoning), "".join(p.text for p in pieces if p.content))


def inline(text: str, in_header: bool = True) -> str:
    """A whole answer with its reasoning kept in the content (llama.cpp's reasoning_format none): each analysis
    message as `<|channel|>analysis<|message|>TEXT<|end|>`, the final and commentary text as it is."""
    parser = HarmonyParser(in_header)
    return "".join(f"{CHANNEL}{REASONING}{MESSAGE}{p.text}<|end|>" if p.reasoning else p.text
                   for p in parser.feed(text) + parser.finish() if p.reasoning or p.content)
