"""runtime/json_digits.py: a JSON number's digit runs held to 16, as llama.cpp's schema grammars hold them; digits
inside strings are free; rollback restores the state."""

from __future__ import annotations

from specrt.runtime.json_digits import MAX_DIGITS, DigitBound

PIECES = [b"{", b'"a"', b": ", b"0", b".", b"3", b"33", b"}", b'"', b"12345678", b"\\", b'"x', b", "]
ID = {p: i for i, p in enumerate(PIECES)}


def _feed(bound, *pieces):
    for p in pieces:
        bound.push(ID[p])


def test_a_fraction_stops_at_sixteen_digits_and_the_rest_stay_allowed():
    bound = DigitBound(PIECES)
    _feed(bound, b"{", b'"a"', b": ", b"0", b".")
    _feed(bound, *[b"3"] * (MAX_DIGITS - 1))
    allowed = bound.allowed()
    assert allowed[ID[b"3"]] and not allowed[ID[b"33"]]  # 15 + 1 fits, 15 + 2 does not
    bound.push(ID[b"3"])
    allowed = bound.allowed()
    assert not allowed[ID[b"3"]] and not allowed[ID[b"12345678"]]
    assert allowed[ID[b"}"]] and allowed[ID[b", "]] and allowed[ID[b"."]]  # the number can end
    bound.pop(2)  # two tokens back: 14 digits, room for two more
    assert bound.allowed()[ID[b"33"]]


def test_digits_inside_strings_are_not_bounded():
    bound = DigitBound(PIECES)
    _feed(bound, b"{", b'"', *[b"12345678"] * 3)  # 24 digits inside a string
    assert bound.allowed() is None
    _feed(bound, b"\\", b'"x')  # an escaped quote keeps the string open
    assert bound.allowed() is None
    _feed(bound, b'"', b": ", *[b"12345678"] * 2)  # closed: a number of 16 digits
    assert not bound.allowed()[ID[b"3"]]
