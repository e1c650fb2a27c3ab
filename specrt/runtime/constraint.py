"""Constrained output: a grammar (a JSON schema, any JSON object) decides which tokens may come next.

The engine llguidance (the optional extra `specrt[grammar]`; docs/research-grammar-engines.md for why) keeps the
grammar's state over the output tokens. Plain decoding masks each step's logits to the allowed tokens before
choosing. Speculative decoding walks the draft through the grammar first: a draft token the grammar forbids cuts
the draft there (it could never be accepted), and every verified position's logits are masked with the grammar's
state after the draft tokens before it, so the verifier picks from the constrained distribution, exactly what
plain constrained decoding picks from (runtime/speculative.py). The state then advances by the tokens kept.
The grammar is also a drafter: where it forces the next bytes (a key, a quote, a brace), their tokens lead the
draft at no drafting cost (`forced`), so a JSON object's fixed parts take no target call of their own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.json_digits import DigitBound


# JSON written one way, as Python's json.dumps writes it: `{"a": 1, "b": [2, 3]}`. With no choice of whitespace the
# grammar forces every key, quote and separator (the grammar drafter's tokens); a schema's own "x-guidance" options
# still apply over these.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(SpecrtError):
    """A grammar or schema that cannot be used (named in one line)."""


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401  (the bitmask helpers)
    except ImportError:
        raise ConstraintError("constrained output needs the grammar engine: pip install 'specrt[grammar]'") from None
    return llguidance


def masked(logits, allowed: np.ndarray):
    """logits [..., V] (numpy, or a torch tensor on the device) with what allowed [..., V] bool forbids at -inf."""
    allowed = allowed[..., :logits.shape[-1]]
    if isinstance(logits, np.ndarray):
        return np.where(allowed, logits, -np.inf).astype(logits.dtype, copy=False)
    import torch

    return logits.masked_fill(~torch.from_numpy(allowed).to(logits.device), float("-inf"))


class GrammarTokenizer:
    """A bundle's tokenizer as the grammar engine reads it (built once per bundle: about a second at 150k tokens)."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, stop_ids):
        llguidance = _llguidance()
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(Path(tokenizer_json).read_text(encoding="utf-8"), n_vocab=vocab_size,
                                                eos_token=sorted(stop_ids))
        self._pieces: list[bytes] | None = None

    def pieces(self) -> list[bytes]:
        """[V] each token's bytes (decoded once per tokenizer)."""
        if self._pieces is None:
            self._pieces = [self.tokenizer.decode_bytes([i]) for i in range(self.vocab_size)]
        return self._pieces

    def special_id(self, text: str) -> int | None:
        """The id of text where it is one special token of the vocabulary (a tool format's marker), else None."""
        ids = self.tokenizer.tokenize_str(text, parse_special=True)
        return ids[0] if len(ids) == 1 and self.tokenizer.is_special_token(ids[0]) else None


class OutputConstraint:
    """The grammar's state over one generation's output tokens; with bound_digits (a JSON schema's output), a JSON
    number's parts are held to 16 digits as llama.cpp's schema grammars hold them (runtime/json_digits.py)."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: str, bound_digits: bool = False):
        llguidance = _llguidance()
        self.vocab_size = tokenizer.vocab_size
        self.matcher = llguidance.LLMatcher(tokenizer.tokenizer, grammar)
        if self.matcher.is_error():
            raise ConstraintError(f"the grammar cannot be used: {self.matcher.get_error()}")
        self.digits = DigitBound(tokenizer.pieces()) if bound_digits else None
        self._bits = llguidance.numpy.allocate_token_bitmask(1, self.vocab_size)
        self._fill = llguidance.numpy.fill_next_token_bitmask

    @staticmethod
    def grammar_for(response_format: dict) -> str:
        """OpenAI's response_format ({"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema":
        ...}}) as a grammar the engine compiles."""
        llguidance = _llguidance()
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind == "json_object":
            schema = {"type": "object"}
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise ConstraintError("response_format json_schema needs a json_schema.schema object")
        else:
            raise ConstraintError(f"response_format type must be json_object or json_schema, got {kind!r}")
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_LAYOUT)
        except (TypeError, ValueError) as exc:
            raise ConstraintError(f"the JSON schema cannot be used: {exc}") from None
        problem = llguidance.LLMatcher.validate_grammar(grammar)  # "" when it compiles
        if problem:
            raise ConstraintError(f"the JSON schema cannot be used: {problem.strip().splitlines()[0]}")
        return grammar

    def allowed(self) -> np.ndarray:
        """[V] bool: the tokens the grammar accepts next."""
        self._fill(self.matcher, self._bits, 0)
        bits = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")
        allowed = bits[:self.vocab_size].astype(bool)
        bound = self.digits.allowed() if self.digits is not None else None
        return allowed if bound is None else allowed & bound

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """logits [V] with every token the grammar forbids now at -inf (a copy)."""
        return masked(logits, self.allowed())

    def consume(self, tokens) -> None:
        for t in tokens:
            if not self.matcher.consume_token(int(t)):
                raise ConstraintError(f"token {int(t)} is not allowed by the grammar here")
            if self.digits is not None:
                self.digits.push(int(t))

    def rollback(self, n: int) -> None:
        if n and not self.matcher.rollback(n):
            raise ConstraintError("the grammar state could not be rolled back")
        if n and self.digits is not None:
            self.digits.pop(n)

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next (its fast-forward: the bytes every allowed continuation
        starts with, as the tokenizer writes them), the grammar drafter's draft; the state is left as it was. The
        target verifies them like any draft (it may tokenize the same bytes otherwise), so they stay lossless."""
        return list(self.matcher.compute_ff_tokens())[:limit] if limit > 0 else []

    def walk(self, tokens) -> tuple[int, list[np.ndarray]]:
        """How many of `tokens` (a chain after the current state) the grammar allows in a row, and the allowed sets
        at each of the positions before, between and after them ([kept + 1] of [V] bool). The state is left as
        it was."""
        masks, kept = [self.allowed()], 0
        for t in tokens:
            if not masks[-1][int(t)]:
                break
            self.consume([t])
            kept += 1
            masks.append(self.allowed())
        self.rollback(kept)
        return kept, masks
