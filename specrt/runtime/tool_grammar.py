"""Building llguidance lark grammars for tool calls: markers that are special tokens, free text up to a marker.

A format's markers (`<|tool_call>`, `<|channel|>`) are single special tokens in their models' vocabularies; the
grammar engine keeps special tokens apart from text bytes, so a grammar names them by id (`<[id]>`). Under another
vocabulary (a test's template on the default model) the same marker is ordinary text and is written as a string.
Free text that ends at a marker (a thought, a string argument) is a lazy lexeme: up to a special token it simply
stops there; up to a text marker it is a `suffix=` lexeme, which ends at the marker's first occurrence and keeps
the state rollback-able (the speculative loop rolls the grammar back over rejected drafts; `stop=` would not).
"""

from __future__ import annotations

import json
from typing import Callable

SpecialId = Callable[[str], "int | None"]  # a marker's id where it is one special token of the vocabulary


def no_specials(_text: str) -> None:
    return None


class LarkBuilder:
    """Collects named rules; `lit`, `upto` and `json` give expressions to use in them."""

    def __init__(self, special_id: SpecialId = no_specials):
        self.special_id = special_id
        self.rules: list[str] = []
        self._names: dict[tuple, str] = {}

    def lit(self, text: str) -> str:
        """A literal: a special token by id, or the text as a string."""
        token = self.special_id(text)
        return f"<[{token}]>" if token is not None else json.dumps(text)

    def is_special(self, text: str) -> bool:
        return self.special_id(text) is not None

    def upto(self, marker: str, min_chars: int = 0, max_chars: int | None = None, not_first: str = "") -> str:
        """Free text (newlines included, `min_chars`..`max_chars` characters; not starting with `not_first`) and
        then the marker."""
        count = "*" if (min_chars, max_chars) == (0, None) else \
            f"{{{min_chars},{'' if max_chars is None else max_chars}}}"
        body = f"/(.|\\n){count}/" + (f" & ~/{regex_text(not_first)}(.|\\n)*/" if not_first else "")
        if self.is_special(marker):
            return f"{body} {self.lit(marker)}" if not not_first else \
                f"{self._named(('free', body), 'free', f': {body}')} {self.lit(marker)}"
        return self._named(("upto", marker, count, not_first), "text", f"[suffix={json.dumps(marker)}]: {body}")

    def rule(self, body: str, hint: str = "r") -> str:
        """A named rule for body (one per distinct body)."""
        return self._named(("rule", body), hint, f": {body}")

    def define(self, name: str, body: str) -> str:
        """The rule `name: body`, written once however often it is asked for (shared rules with fixed names)."""
        if ("define", name) not in self._names:
            self._names[("define", name)] = name
            self.rules.append(f"{name}: {body}")
        return name

    def _named(self, key: tuple, hint: str, rest: str) -> str:
        if key not in self._names:
            name = f"{hint}{len(self._names)}"
            self._names[key] = name
            self.rules.append(name + rest)
        return self._names[key]

    @staticmethod
    def json(schema: dict) -> str:
        """JSON that fits the schema, written as json.dumps writes it (runtime/constraint.py JSON_LAYOUT)."""
        from specrt.runtime.constraint import JSON_LAYOUT

        return f"%json {json.dumps({**schema, 'x-guidance': {**JSON_LAYOUT, **schema.get('x-guidance', {})}})}"

    def grammar(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self.rules]) + "\n"


def regex_text(text: str) -> str:
    """text as a literal inside a lark /regex/."""
    return "".join("\\" + c if c in "\\.+*?()|[]{}^$#&-~/" else c for c in text)


def alternatives(items: list[str]) -> str:
    return items[0] if len(items) == 1 else "(" + " | ".join(items) + ")"


def sequence(items: list[tuple[str, bool]], separator: str, builder: LarkBuilder, hint: str) -> str:
    """Items (expression, required) in order, separator between those present: optional items may be left out
    without leaving a stray separator. Returns an expression ("" for nothing at all)."""
    memo: dict[tuple[int, bool], str] = {}

    def rest(k: int, first: bool) -> str:
        if k == len(items):
            return ""
        if (k, first) in memo:
            return memo[(k, first)]
        expr, required = items[k]
        taken = " ".join(x for x in ((separator if not first else ""), expr, rest(k + 1, False)) if x)
        if required:
            out = taken
        else:
            skipped = rest(k + 1, first)
            out = f"({taken} | {skipped})" if skipped else f"({taken})?"
        out = builder.rule(out, hint) if len(out) > 80 else out
        memo[(k, first)] = out
        return out

    return rest(0, True)
