"""A multi-turn chat on one engine: the conversation as messages, rendered by the bundle's template.

Each turn renders the whole conversation, and the engine's prefix cache prefills only what is new
(the user's turn, plus any template tokens that differ from what the model generated).
"""

from __future__ import annotations

from specrt.runtime.generation import Generation, GenerationResult
from specrt.runtime.sampling import SamplingParams


class ChatSession:
    def __init__(self, engine, system: str | None = None):
        self.engine = engine
        self.system = system
        self.messages: list[dict] = []
        self.last: GenerationResult | None = None
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.last = None

    def send(self, text: str, params: SamplingParams | None = None, response_format: dict | None = None,
             tools: list | None = None, tool_choice="auto") -> Generation:
        """Stream the answer to `text`; the exchange joins the conversation once the answer is complete
        (an answer stopped early, e.g. by Ctrl-C, is kept as far as it got). response_format, tools: as
        engine.generate takes them (the answer's tool calls join the conversation with it)."""
        self.messages.append({"role": "user", "content": text})
        try:
            options = {"response_format": response_format} if response_format is not None else {}
            if tools is not None:
                options.update(tools=tools, tool_choice=tool_choice)
            inner = self.engine.generate(self.messages, params, **options)
        except Exception:
            self.messages.pop()
            raise
        outer = Generation(iter(()))
        outer._chunks = self._follow(inner, outer)
        return outer

    def _follow(self, inner: Generation, outer: Generation):
        parts: list[str] = []
        try:
            for chunk in inner:
                parts.append(chunk)
                yield chunk
        finally:
            inner.close()
            outer.result = inner.result
            self.last = inner.result
            text = inner.result.text if inner.result else "".join(parts)
            if self.engine.tokenizer.harmony:  # the conversation keeps the answer; the template drops the reasoning
                from specrt.runtime.harmony import split

                text = split(text)[1]
            calls = inner.result.tool_calls if inner.result else None
            self.messages.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
