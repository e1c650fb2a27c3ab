"""Gemma 4's tool-call argument syntax: read it, and constrain it to a JSON schema.

Gemma 4 writes a call as `<|tool_call>call:NAME{key:VALUE,key:VALUE}<tool_call|>`: keys bare (sorted, as its chat
template's dictsort writes them), strings between `<|"|>` quote markers (one special token in its vocabulary),
numbers, true / false / null as in JSON, nested objects `{key:VALUE}` and arrays `[VALUE,VALUE]`.
"""

from __future__ import annotations

import json

from specrt.runtime.tool_grammar import LarkBuilder, alternatives, sequence

QUOTE = '<|"|>'
CALL_OPEN, CALL_CLOSE = "<|tool_call>", "<tool_call|>"


class ArgumentSyntaxError(ValueError):
    pass


def parse_arguments(body: str) -> dict:
    """'key:<|"|>Paris<|"|>,n:3' (the text between a call's braces) -> {"key": "Paris", "n": 3}."""
    value, end = _object(body, 0, closing="")
    if end != len(body):
        raise ArgumentSyntaxError(f"text after the arguments at {end}")
    return value


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \n\t":
        i += 1
    return i


def _object(s: str, i: int, closing: str = "}") -> tuple[dict, int]:
    out: dict = {}
    i = _skip(s, i)
    while i < len(s) and not (closing and s.startswith(closing, i)):
        if s.startswith(QUOTE, i):  # a quoted key (the template quotes keys of nested values in responses)
            j = s.index(QUOTE, i + len(QUOTE))
            key, i = s[i + len(QUOTE):j], j + len(QUOTE)
        else:
            j = s.index(":", i)
            key, i = s[i:j].strip(), j
        if not s.startswith(":", i):
            raise ArgumentSyntaxError(f"':' expected at {i}")
        out[key], i = _value(s, _skip(s, i + 1))
        i = _skip(s, i)
        if s.startswith(",", i):
            i = _skip(s, i + 1)
    if closing:
        if not s.startswith(closing, i):
            raise ArgumentSyntaxError(f"{closing!r} expected at {i}")
        i += len(closing)
    return out, i


def _value(s: str, i: int):
    if s.startswith(QUOTE, i):
        j = s.index(QUOTE, i + len(QUOTE))
        return s[i + len(QUOTE):j], j + len(QUOTE)
    if s.startswith("{", i):
        return _object(s, i + 1)
    if s.startswith("[", i):
        items, i = [], _skip(s, i + 1)
        while not s.startswith("]", i):
            item, i = _value(s, i)
            items.append(item)
            i = _skip(s, i)
            if s.startswith(",", i):
                i = _skip(s, i + 1)
            elif not s.startswith("]", i):
                raise ArgumentSyntaxError(f"',' or ']' expected at {i}")
        return items, i + 1
    j = i
    while j < len(s) and s[j] not in ",}]":
        j += 1
    raw = s[i:j].strip()
    try:
        return json.loads(raw), j
    except ValueError:
        return raw, j  # a bare word: as text


def write_value(value) -> str:
    """A value in the call syntax (the template's format_argument with bare keys)."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{write_value(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(write_value(v) for v in value) + "]"
    return json.dumps(value)


def arguments_lark(schema: dict, b: LarkBuilder) -> str:
    """An expression for the text between a call's braces, fitting the parameters schema."""
    return _members(schema, b) or '""'


def _members(schema: dict, b: LarkBuilder) -> str:
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return _generic_members(b) if schema.get("additionalProperties", True) is not False else ""
    required = set(schema.get("required", ()))
    items = [(f"{json.dumps(key + ':')} {_value_lark(props[key], b)}", key in required) for key in sorted(props)]
    return sequence(items, '","', b, "members")


def _value_lark(schema, b: LarkBuilder) -> str:
    if not isinstance(schema, dict):
        return _generic(b)
    if "const" in schema:
        return _literal(schema["const"], b)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return alternatives([_literal(v, b) for v in schema["enum"]])
    kinds = schema.get("type")
    if isinstance(kinds, list):
        return alternatives([_value_lark({**schema, "type": k}, b) for k in kinds]) if kinds else _generic(b)
    if kinds == "string":
        text = b.upto(QUOTE, int(schema.get("minLength", 0)), schema.get("maxLength"))
        return f"{b.lit(QUOTE)} {text}"
    if kinds in ("integer", "number"):
        return b.json({k: v for k, v in schema.items() if k in (
            "type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")})
    if kinds == "boolean":
        return '("true" | "false")'
    if kinds == "null":
        return '"null"'
    if kinds == "array":
        item = _value_lark(schema.get("items", {}), b)
        lo, hi = int(schema.get("minItems", 0)), schema.get("maxItems")
        more = f'("," {item}){{{max(lo - 1, 0)},{"" if hi is None else max(int(hi) - 1, 0)}}}'
        body = f"{item} {more}"
        if hi is not None and int(hi) == 0:
            return '"[]"'
        return f'"[" ({body})? "]"' if lo == 0 else f'"[" {body} "]"'
    if kinds == "object" or "properties" in schema:
        members = _members(schema, b)
        return f'"{{" {members} "}}"' if members else '"{}"'
    return _generic(b)


def _literal(value, b: LarkBuilder) -> str:
    if isinstance(value, str):
        return f"{b.lit(QUOTE)} {json.dumps(value)} {b.lit(QUOTE)}"
    return json.dumps(write_value(value))


def _generic(b: LarkBuilder) -> str:
    """Any value (a schema this does not translate: anyOf, $ref ...)."""
    b.define("gvalue", 'gstring | gnumber | "true" | "false" | "null" | gobject | garray')
    b.define("gstring", f"{b.lit(QUOTE)} {b.upto(QUOTE)}")
    b.define("gnumber", '%json {"type": "number"}')
    b.define("gmember", '/[A-Za-z_][A-Za-z0-9_]*/ ":" gvalue')
    b.define("gmembers", '(gmember ("," gmember)*)?')
    b.define("gobject", '"{" gmembers "}"')
    b.define("garray", '"[" (gvalue ("," gvalue)*)? "]"')
    return "gvalue"


def _generic_members(b: LarkBuilder) -> str:
    """Any members of an object: `key:value` pairs, comma-separated."""
    _generic(b)
    return "gmembers"
