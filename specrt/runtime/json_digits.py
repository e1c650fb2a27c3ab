"""A bound on how many digits a JSON number's part may run to, on top of a JSON schema's grammar.

A schema's grammar lets a number run on forever (`0.0000133333...`), and a small model decoding greedily can loop in
one until the token limit. llama.cpp's schema grammars bound them: at most 16 digits in a number's integral part,
its fraction and its exponent (json-schema-to-grammar: `[1-9] [0-9]{0,15}`, `[0-9]{1,16}`). This keeps the same
bound as a mask beside the grammar's: outside JSON strings, a token that would make a run of digits longer than
MAX_DIGITS is forbidden, so the grammar then has the number end. The mask is a function of the output so far, the
same in plain and speculative steps, so every drafter still gives the same greedy output.
"""

from __future__ import annotations

import numpy as np

MAX_DIGITS = 16
DIGITS = frozenset(b"0123456789")


def _leading_digits(piece: bytes) -> int:
    n = 0
    while n < len(piece) and piece[n] in DIGITS:
        n += 1
    return n


class DigitBound:
    """The digit run and JSON string state after the output's tokens (one entry per token, for rollback)."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces  # [V] each token's bytes
        self.leading = np.array([_leading_digits(p) for p in pieces], dtype=np.int32)  # [V]
        self.states: list[tuple[int, bool, bool]] = [(0, False, False)]  # (digit run, in a string, escaped)

    def allowed(self) -> np.ndarray | None:
        """[V] bool of the tokens the bound allows next, or None where it allows every token."""
        run, in_string, _ = self.states[-1]
        if in_string:
            return None
        return self.leading <= MAX_DIGITS - run

    def push(self, token: int) -> None:
        run, in_string, escaped = self.states[-1]
        for byte in self.pieces[token] if 0 <= token < len(self.pieces) else b"":
            if in_string:
                if escaped:
                    escaped = False
                elif byte == 0x5C:  # backslash
                    escaped = True
                elif byte == 0x22:  # the closing quote
                    in_string = False
                run = 0
            elif byte == 0x22:
                in_string, run = True, 0
            else:
                run = run + 1 if byte in DIGITS else 0
        self.states.append((run, in_string, escaped))

    def pop(self, n: int) -> None:
        del self.states[len(self.states) - n:]
