"""Streaming detokenization that never splits a multi-byte character.

Byte-level BPE tokens can end in the middle of a UTF-8 character (emoji, CJK); decoding them alone gives
U+FFFD. The decoder re-decodes a short window of recent tokens and emits only text that is stable: the
window's decode minus what was already emitted, held back while it ends in an incomplete character.
The same scheme as vLLM's incremental detokenizer (prefix/read offsets). Chunks concatenate to the full
decode, which `finish()` guarantees by emitting whatever the full decode still has beyond the chunks.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class StreamDecoder:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: decoded only as context
        self.read_offset = 0  # tokens before this are already emitted
        self.emitted = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_id: int) -> str:
        """Add one token; returns the newly stable text (possibly empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if full.endswith(REPLACEMENT) or len(full) <= len(prefix) or not full.startswith(prefix):
            return ""
        new = full[len(prefix):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.emitted += new
        return new

    def finish(self) -> str:
        """The rest of the text, so that all chunks together equal decode(all ids)."""
        full = self._decode(self.ids)
        if full.startswith(self.emitted):
            rest = full[len(self.emitted):]
        else:  # cannot happen for tokenizers whose decode is prefix-stable; keep the contract anyway
            rest = full[len(self.emitted):] if len(full) > len(self.emitted) else ""
        self.emitted += rest
        return rest

    @property
    def text(self) -> str:
        return self.emitted
