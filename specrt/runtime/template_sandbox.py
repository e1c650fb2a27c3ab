"""A bundle's chat template (jinja2), compiled and rendered in a bounded sandbox: jinja2's immutable sandbox with
`raise_exception`, as transformers' apply_chat_template renders (runtime/tokenizer.py feeds it the messages and
tokenizer_config.json's tokens). A bundle is a file people share, so its template is code from a stranger, and
every render is bounded (a TemplateError with
`limit` set, naming the limit, instead of a hang or a memory blow-up):

- time: jinja's language repeats work only through {% for %} and calls (macros, caller(), a recursive loop's
  loop(), self.block()), so every item of every loop (each loop's iterable goes through a step-counting filter,
  added to the parsed template before it is compiled, where the template cannot rename it) and every call the
  sandbox makes is a step: RENDER_STEPS per render, printing or not, and the clock is read every 16 steps and
  before any large result, against RENDER_SECONDS; `range` hands out at most RENDER_ITEMS items per render;
- size: the render's cap is RENDER_CHARS characters plus twice the messages' own. Whatever could build a longer
  string or list from small arguments is refused before it allocates, from its arguments: `*` and `+` on strings,
  lists and bytes, `~`, `%` and str.format (their widths, precisions and each field's text), the filters that
  pad, repeat or fill (center, indent, wordwrap, replace, join, format, urlize, batch, slice, sum...), the string
  methods that do (ljust, rjust, center, zfill, expandtabs, replace, join, translate, int.to_bytes), and the
  printing of a container (a list that holds one list twice, 40 levels deep, prints 2**40 times). Powers stop at
  64 and numbers at RENDER_INT_BITS bits. The output stops at the cap;
- comparisons: Python compares two such lists element by element inside C (2**40 comparisons, no step counted),
  so every operand of a comparison and the input of the sorting and deduplicating filters is measured first
  (_compared: each container counted as often as it is reached) and refused past RENDER_ITEMS elements;
- memory: what the render builds (every such result, a slice, a block's text) adds up against RENDER_BUILT bytes
  per character of the cap, so that many results under the cap, kept in a list, are bounded too.

The counters live in a contextvar, one set per render: a BundleTokenizer renders from several threads at once.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import json
import re
import reprlib
import sys
import time
import types
from collections import abc

from specrt.errors import BundleError, SpecrtError


class TemplateError(SpecrtError):
    """The chat template could not render the messages. `limit` is set where it went past one of the render's
    limits (the template's own fault, whatever the conversation), not where it failed on these messages (a
    raise_exception, an undefined name)."""

    def __init__(self, message="", *args, limit: bool = False):
        super().__init__(message, *args)
        self.limit = limit


RENDER_ITEMS = 1_000_000  # range() items one render may ask for, all loops together
RENDER_CHARS = 1 << 22  # characters one render may produce (plus twice the messages' own)
RENDER_SECONDS = 5.0
RENDER_STEPS = 5_000_000  # loop items and calls one render may run (a real template: a few per message)
RENDER_BUILT = 16  # bytes of strings and lists one render may build, per character of its cap
RENDER_INT_BITS = 1 << 16  # the largest number a product or power may make (str() stops at 4300 digits anyway)
TOJSON_INDENT = 16  # the widest tojson indent (real templates use 2 or 4; each nesting level repeats it)


_REPR = reprlib.Repr()  # values in error messages, shortened: a template can pass any value it built
_REPR.maxstring = _REPR.maxother = 200


def _raise(message):
    text = message if isinstance(message, str) else _REPR.repr(message)
    raise TemplateError(f"chat template: {text[:500]}")


def _over(message: str) -> TemplateError:
    return TemplateError(f"chat template: {message}", limit=True)


# -- one render's budget ----------------------------------------------------------------------------------------

class _Budget:
    """What one render has used: steps, range items, bytes built; its cap and deadline."""

    __slots__ = ("cap", "deadline", "steps", "items", "built")

    def __init__(self, cap: int):
        self.cap, self.deadline = cap, time.perf_counter() + RENDER_SECONDS
        self.steps = self.items = self.built = 0

    def step(self) -> None:
        self.steps += 1
        if not self.steps & 15:  # a step can be slow (`x in a_long_list`): the clock is read often
            if self.steps > RENDER_STEPS:
                raise _over(f"it ran over {RENDER_STEPS} steps (loop items and calls: a loop that does not end soon)")
            self.check_clock()

    def check_clock(self) -> None:
        if time.perf_counter() > self.deadline:
            raise _over(f"rendering took over {RENDER_SECONDS:.0f} s")


_RENDER: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("specrt_chat_template_render", default=None)


def _budget() -> _Budget:
    # outside a render (jinja folds constant filters while it compiles): the caps alone, nothing carried over
    budget = _RENDER.get()
    return budget if budget is not None else _Budget(RENDER_CHARS)


class _Steps:
    """A loop's items, each one a step of the render (every {% for %} iterates through this); sized where its
    iterable is, so that loop.length does not copy the items."""

    __slots__ = ("_iterable", "_items", "_step")

    def __init__(self, iterable):
        self._iterable, self._items, self._step = iterable, iter(iterable), _budget().step

    def __iter__(self):
        return self

    def __next__(self):
        self._step()
        return next(self._items)

    def __len__(self) -> int:
        return len(self._iterable)  # a TypeError for a generator: jinja's LoopContext then lists what is left


# filters' names (a template can shadow a global, not a filter) for what the template's own syntax does
_STEPS_FILTER, _SLICE_FILTER, _COMPARED_FILTER = "specrt_loop_steps", "specrt_slice", "specrt_compared"


def _sliced(value, start, stop, step):
    return _charge(value[start:stop:step])  # a copy: counted as any other result


def _instrument(tree, env):
    """The parsed template, before it is compiled: every {% for %} iterates through _Steps, every slice goes
    through _sliced (jinja compiles slices to a plain subscript, past the sandbox's getitem), and every operand of a
    comparison through _compared."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    class Instrument(NodeTransformer):
        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = nodes.Filter(node.iter, _STEPS_FILTER, [], [], None, None, lineno=node.iter.lineno)
            return node

        def visit_Compare(self, node):  # ==, <, in...: Python compares containers element by element, in C
            node = self.generic_visit(node)
            node.expr = nodes.Filter(node.expr, _COMPARED_FILTER, [], [], None, None, lineno=node.lineno)
            for operand in node.ops:
                operand.expr = nodes.Filter(operand.expr, _COMPARED_FILTER, [], [], None, None, lineno=node.lineno)
            return node

        def visit_Getitem(self, node):
            node = self.generic_visit(node)
            if not isinstance(node.arg, nodes.Slice) or node.ctx != "load":
                return node
            bounds = [nodes.Const(None) if b is None else b for b in (node.arg.start, node.arg.stop, node.arg.step)]
            return nodes.Filter(node.node, _SLICE_FILTER, bounds, [], None, None, lineno=node.lineno)

    tree = Instrument().visit(tree)
    tree.set_environment(env)
    return tree


def _compared(value):
    """A value about to be compared or hashed, refused where Python would walk more than RENDER_ITEMS elements to
    do it: a list holding one list twice, 40 levels deep, is 80 steps to build and 2**40 to compare with its like
    (inside C, where no step is counted). Each container is counted as often as it is reached, each distinct one
    measured once."""
    if isinstance(value, (list, tuple, dict, set, frozenset)) and _reached(value) > RENDER_ITEMS:
        raise _over(f"comparing or sorting a structure of over {RENDER_ITEMS} elements (counted as often as reached)")
    return value


def _reached(value) -> int:
    """Elements reached walking a container and everything in it, shared parts counted each time: measured bottom
    up, each distinct container once (the memo keeps them alive, so ids stay theirs); stops past the limit."""
    memo: dict[int, tuple[object, int]] = {}
    pending = [(value, False)]
    while pending:
        item, children_done = pending.pop()
        if id(item) in memo:
            continue
        children = list(item.items()) if isinstance(item, dict) else list(item)
        nested = [c for pair in children for c in (pair if isinstance(item, dict) else (pair,))
                  if isinstance(c, (list, tuple, dict, set, frozenset))]
        if not children_done:
            pending.append((item, True))
            pending.extend((c, False) for c in nested if id(c) not in memo)
            continue
        total = len(children) + sum(memo[id(c)][1] for c in nested)
        memo[id(item)] = (item, min(total, RENDER_ITEMS + 1))
        _budget().step()
    return memo[id(value)][1]


def _take_items(count: int) -> None:
    budget = _budget()
    budget.items += count
    if budget.items > RENDER_ITEMS:
        raise TemplateError(f"chat template: its loops ask for more than {RENDER_ITEMS} items", limit=True)


_LARGE = 1 << 16  # a result this long takes long enough to build that the clock is read first


def _fits(length: int, what: str) -> None:
    """Refuse, before it is built, a result longer than the render's cap."""
    budget = _budget()
    if length > _LARGE:
        budget.check_clock()
    if length > budget.cap:
        raise _over(f"{what} would be {length} characters long, past the cap of {budget.cap} characters")


_SEQUENCES = (str, bytes, bytearray, list, tuple)
_SIZED = (*_SEQUENCES, dict, set, frozenset)


def _charge(value, deep: bool = False):
    """Count a result against the cap (its length) and the render's allocation budget (its bytes; with deep, its
    items' too: the pieces of a split are new strings)."""
    if isinstance(value, _SIZED):
        budget = _budget()
        if len(value) > _LARGE:
            budget.check_clock()
        if len(value) > budget.cap:
            raise _over(f"a result of {len(value)} characters or items, past the cap of {budget.cap}")
        budget.built += sys.getsizeof(value)
        if deep and isinstance(value, (list, tuple)):
            budget.built += sum(map(sys.getsizeof, value))
        if budget.built > RENDER_BUILT * budget.cap:
            raise _over(f"its strings and lists add up to over {RENDER_BUILT * budget.cap} bytes")
    return value


# -- how long a result would be, from its arguments -------------------------------------------------------------

_PRINTS_SMALL = 100  # what another object prints, at most (a loop, a macro, an undefined: a type and a name)


def _text_size(value, cap: int) -> int:
    """An upper bound, give or take quotes and escapes, of what str(value), its repr or its JSON prints: each
    container is walked once (one held twice prints twice: counted twice, walked once), and the walk stops
    past cap."""
    from jinja2.runtime import Namespace

    seen = {}  # id -> (container, size): the container is kept so that its id is not reused during the walk

    def size(v) -> int:
        kind = type(v)
        if kind is str:  # most leaves: checked first, and inline below
            return len(v) + 2
        if kind is not dict and kind is not list:
            if isinstance(v, (str, bytes, bytearray)):
                return len(v) + 2
            if isinstance(v, int):
                return v.bit_length() // 3 + 2
            if isinstance(v, float) or v is None:
                return 24
            if isinstance(v, Namespace):
                v = v._Namespace__attrs  # it prints its attributes
            elif not isinstance(v, (list, tuple, dict, set, frozenset, abc.MappingView)):
                return _PRINTS_SMALL
        known = seen.get(id(v))
        if known is not None:
            return known[1]
        seen[id(v)] = (v, 5)  # a container inside itself prints as [...]
        total = 2
        if isinstance(v, dict):
            for k, x in v.items():
                total += (len(k) if type(k) is str else size(k)) + (len(x) if type(x) is str else size(x)) + 6
                if total > cap:
                    break
        else:
            for x in v:
                total += (len(x) if type(x) is str else size(x)) + 4
                if total > cap:
                    break
        seen[id(v)] = (v, total)
        return total

    return size(value)


def _length_of(value) -> int:
    """len(value) for a string; for anything else, the bound of what it prints, refused past the cap."""
    if isinstance(value, str):
        return len(value)
    size = _text_size(value, _budget().cap)
    _fits(size, f"printing a {type(value).__name__}")
    return size


def _reserve_characters(value) -> None:
    """Before a string is made a list (|list, |sort, |join...): each character becomes its own string, 80 bytes
    apiece past Latin-1 (which Python shares), plus the list's 8. Charged before the list exists."""
    if isinstance(value, str) and len(value) > _LARGE:
        budget = _budget()
        budget.built += len(value) * (8 if value.isascii() or max(value) <= "\xff" else 88)
        if budget.built > RENDER_BUILT * budget.cap:
            raise _over(f"its strings and lists add up to over {RENDER_BUILT * budget.cap} bytes")


def _text(value) -> str:
    """str(value), refused before it is built where it would print past the cap."""
    if isinstance(value, str):
        return value
    _length_of(value)
    return _charge(str(value))


def _number(digits: str) -> int:
    return int(digits) if len(digits) < 19 else 10 ** 19  # a width no cap lets through, not a 4300-digit int


def _spec_width(spec: str) -> int:
    # every number in a format spec, added up: at least its width plus its precision
    return sum(_number(d) for d in re.findall(r"[0-9]+", spec))


_PRINTF_TAIL = re.compile(r"[#0\- +]*(\*|[0-9]+)?(?:\.(\*|[0-9]*))?[hlL]?(.)?", re.S)


def _printf_length(fmt, values) -> int:
    """An upper bound of len(fmt % values): the format's text, and for each conversion its width, its precision
    and its value's text (a mapping key used a million times counts a million times)."""
    if isinstance(fmt, (bytes, bytearray)):
        fmt = fmt.decode("latin-1")
    cap = _budget().cap
    positional = list(values) if isinstance(values, tuple) else [values]
    mapping = None if isinstance(values, (tuple, str)) else values
    total, i, n = len(fmt), 0, len(fmt)
    try:
        while total <= cap and (i := fmt.find("%", i)) >= 0:
            i, key = i + 1, None
            if fmt.startswith("(", i):  # a mapping key: Python's parser lets its parentheses nest
                depth, j = 1, i + 1
                while j < n and depth:
                    depth += (fmt[j] == "(") - (fmt[j] == ")")
                    j += 1
                key, i = fmt[i + 1:j - 1], j
            match = _PRINTF_TAIL.match(fmt, i)
            i = match.end()
            width, precision, kind = match.groups()
            if kind == "%":  # a literal %, already counted in the format's length
                continue
            for part in (width, precision):
                if part == "*":
                    total += abs(positional.pop(0))
                elif part:
                    total += _number(part)
            value = mapping[key] if key is not None else positional.pop(0)
            total += _conversion_size(value, kind, cap)
    except (LookupError, TypeError, ValueError):  # a missing value or a bad spec: Python's own `%` says which
        pass
    return total


def _conversion_size(value, kind: str | None, cap: int) -> int:
    if kind == "c":
        return 1
    if isinstance(value, float):
        return 320  # %f prints every digit of 1e308
    return _text_size(value, cap)


_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines splits


def _line_count(s) -> int:
    return sum(s.count(c) for c in _LINE_BREAKS) + 1 if isinstance(s, str) else 1


def _replaced_length(s, old, new, count=-1) -> int | None:
    kind = str if isinstance(s, str) else bytes
    if not (isinstance(s, (str, bytes)) and isinstance(old, kind) and isinstance(new, kind)):
        return None  # Python's replace says what is wrong
    found = s.count(old)  # an empty `old` is found len(s) + 1 times
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(s) + found * (len(new) - len(old))


def _method_length(owner, name: str, args: tuple, kwargs: dict) -> int | None:
    """How long str/bytes `owner`.`name`(*args) would be, for the methods that can build more than they are
    given; None for the others (their results are charged after)."""
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else None
        return max(len(owner), width) if isinstance(width, int) else None
    if name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        tabs = owner.count("\t" if isinstance(owner, str) else b"\t")
        return len(owner) + tabs * max(tab, 0) if isinstance(tab, int) else None
    if name == "replace" and len(args) >= 2:
        return _replaced_length(owner, *args[:3])
    if name == "translate" and args and isinstance(owner, str):
        table = args[0]
        values = table.values() if isinstance(table, dict) else table if isinstance(table, (list, tuple)) else ()
        return len(owner) * max((len(v) for v in values if isinstance(v, str)), default=1)
    return None


def _check_call(obj, args: tuple, kwargs: dict) -> tuple:
    """The sandbox's call of `obj`: refuse a string method (or int.to_bytes) whose result would pass the cap;
    returns the arguments to call with (join's iterable, made a list to be measured)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", None)
    if isinstance(owner, (str, bytes, bytearray)):
        if name == "join" and args:
            _reserve_characters(args[0])
            parts = list(args[0])
            sizes = sum(len(p) for p in parts if isinstance(p, (str, bytes)))
            _fits(sizes + len(owner) * max(len(parts) - 1, 0), f"{type(owner).__name__}.join")
            return (parts, *args[1:])
        length = _method_length(owner, name, args, kwargs)
        if length is not None:
            _fits(length, f"{type(owner).__name__}.{name}")
    elif isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        if isinstance(length, int):
            _fits(length, "int.to_bytes")
    return args


def _check_binop(operator: str, left, right) -> None:
    if operator == "**" and isinstance(right, (int, float)):
        if abs(right) > 64:
            raise _over("a power above 64")
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() * right > RENDER_INT_BITS:
            raise _over(f"a number of over {RENDER_INT_BITS} bits")
    elif operator == "*":
        cap = _budget().cap
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, _SEQUENCES) and isinstance(count, int) and len(seq) * count > cap:
                raise _over(f"a repetition longer than {cap} items")
        if isinstance(left, int) and isinstance(right, int) \
                and left.bit_length() + right.bit_length() > RENDER_INT_BITS:
            raise _over(f"a number of over {RENDER_INT_BITS} bits")
    elif operator == "+" and isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
        _fits(len(left) + len(right), "a concatenation")
    elif operator == "%" and isinstance(left, (str, bytes)):
        _fits(_printf_length(left, right), "a %-formatted string")


# -- the bounded pieces that replace jinja's ---------------------------------------------------------------------

def _range(*args):
    items = range(*args)
    _take_items(len(items))
    return items


def _lipsum(n=5, html=True, min=20, max=100):  # noqa: A002 (jinja's own argument names)
    from jinja2.utils import generate_lorem_ipsum

    _take_items(n * (max if max > min else min))  # words it will draw
    return _charge(generate_lorem_ipsum(n, html, min, max))


def _str_join(seq) -> str:
    """`~`: its pieces measured before they are joined (jinja's str_join, which the compiled template names)."""
    parts = [_text(v) for v in seq]
    _fits(sum(map(len, parts)), "a ~ concatenation")
    return _charge("".join(parts))


def _markup_join(seq) -> str:
    from jinja2.runtime import markup_join

    parts = [v if hasattr(v, "__html__") else _text(v) for v in seq]
    _fits(sum(len(p) if isinstance(p, str) else _PRINTS_SMALL for p in parts), "a ~ concatenation")
    return _charge(markup_join(parts))


def _finalize(value):
    """Every {{ }} goes through this before str(): a container is measured before it is printed."""
    if isinstance(value, str) or hasattr(value, "__html__"):
        return value
    return _text(value)


def _bounded_undefined():
    from jinja2.runtime import Undefined as JinjaUndefined
    from jinja2.utils import missing, object_type_repr

    class Undefined(JinjaUndefined):  # jinja's name: messages ("Object of type Undefined...") read the same
        """Its error message shows the missing name through reprlib: the name can be any value the template
        built (d[a_huge_list])."""

        __slots__ = ()

        @property
        def _undefined_message(self) -> str:
            name = _REPR.repr(self._undefined_name)
            if self._undefined_hint:
                return self._undefined_hint[:500]
            if self._undefined_obj is missing:
                return f"{name} is undefined"
            if not isinstance(self._undefined_name, str):
                return f"{object_type_repr(self._undefined_obj)} has no element {name}"
            return f"{object_type_repr(self._undefined_obj)!r} has no attribute {name}"

    return Undefined


# filters whose result is measured from their arguments before they run (the argument after jinja's own)
def _center(value, width=80):
    return max(_length_of(value), width) if isinstance(width, int) else 0


def _indented(s, width=4, first=False, blank=False):
    indent = len(width) if isinstance(width, str) else width
    return _length_of(s) + _line_count(s) * max(indent, 0)


def _wrapped(s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
    # at worst one line per character, each ending in wrapstring
    return (_length_of(s) + 1) * (1 + _length_of(wrapstring or "\n"))


def _urlized(value, trim_url_limit=None, nofollow=False, target=None, rel=None, extra_schemes=None):
    # a link is at least 4 characters, and each prints twice with its rel and target
    length = _length_of(value)
    return 3 * length + (length // 4 + 1) * (80 + _length_of(target or "") + _length_of(rel or ""))


def _replaced(s, old, new, count=None):
    return _replaced_length(_text(s), _text(old), _text(new), -1 if count is None else count) or 0


def _truncated(s, length=255, killwords=False, end="...", leeway=None):
    return _length_of(s) + _length_of(end)


def _formatted(value, *args, **kwargs):
    return _printf_length(_text(value), kwargs or args)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    width = len(indent) if isinstance(indent, str) else indent or 0
    if width > TOJSON_INDENT:
        raise _over(f"a tojson indent over {TOJSON_INDENT}")
    return _text_size(value, _budget().cap)


_FILTER_LENGTHS = {"center": _center, "indent": _indented, "wordwrap": _wrapped, "urlize": _urlized,
                   "replace": _replaced, "truncate": _truncated, "format": _formatted, "tojson": _tojson}
# filters that print their value: a container is measured first
# filters that make a list of their value's items (of a string: a string per character)
_LISTING_FILTERS = {"list", "sort", "unique", "groupby", "slice", "batch", "reverse", "random", "dictsort"}
_PRINTING_FILTERS = {"capitalize", "e", "escape", "forceescape", "lower", "upper", "title", "trim", "striptags",
                     "string", "wordcount", "pprint", "xmlattr", "urlencode"}


_COMPARING_FILTERS = {"sort", "unique", "groupby", "dictsort", "min", "max"}  # they compare or hash the items


def _bounded_filter(name: str, f):
    from jinja2.utils import _PassArg

    skip = 1 if _PassArg.from_obj(f) is not None else 0  # jinja passes its context or environment first
    length = _FILTER_LENGTHS.get(name)

    @functools.wraps(f)  # keeps jinja_pass_arg
    def bounded(*args, **kwargs):
        if length is not None:
            try:
                expected = length(*args[skip:], **kwargs)
            except (TypeError, AttributeError, LookupError):
                expected = 0  # arguments the filter itself refuses, with its own message
            _fits(expected, f"the {name} filter's result")
        elif name in _PRINTING_FILTERS and len(args) > skip:
            _length_of(args[skip])
        if name in _LISTING_FILTERS and len(args) > skip:
            _reserve_characters(args[skip])
        if name in _COMPARING_FILTERS and len(args) > skip:
            _compared(args[skip])
        return _charge(f(*args, **kwargs))

    return bounded


# batch and slice charge each list they hand out as it is made (|list keeps them all)
def _batch(value, linecount, fill_with=None):
    from jinja2.filters import do_batch

    if fill_with is not None and isinstance(linecount, int):
        _fits(linecount, "a batch filled with fill_with")  # the last batch is filled up to linecount
    return map(_charge, do_batch(value, linecount, fill_with))


def _slice(value, slices, fill_with=None):
    from jinja2.filters import sync_do_slice

    if isinstance(slices, int):
        _take_items(slices)  # one list per slice, whatever the value's length
    return map(_charge, sync_do_slice(value, slices, fill_with))


def _join(eval_ctx, value, d="", attribute=None):
    from jinja2.filters import make_attrgetter, sync_do_join

    _reserve_characters(value)
    if attribute is not None:
        value = map(make_attrgetter(eval_ctx.environment, attribute), value)
    parts = [v if hasattr(v, "__html__") else _text(v) for v in value]
    sizes = sum(len(p) if isinstance(p, str) else _PRINTS_SMALL for p in parts)
    _fits(sizes + len(_text(d)) * max(len(parts) - 1, 0), "the join filter's result")
    return _charge(sync_do_join(eval_ctx, parts, d))


def _sum(environment, iterable, attribute=None, start=0):
    """Lists and tuples are added up in one pass, measured first (sum() copies the total once per item: 4 million
    one-item lists would take hours)."""
    from jinja2.filters import make_attrgetter

    _reserve_characters(iterable)
    if attribute is not None:
        iterable = map(make_attrgetter(environment, attribute), iterable)
    items = list(iterable)
    if not isinstance(start, (list, tuple)):
        return _charge(sum(items, start))  # numbers (a string or a list after a number fails at once)
    kind = list if isinstance(start, list) else tuple
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f'can only concatenate {kind.__name__} (not "{type(item).__name__}") to {kind.__name__}')
    _fits(len(start) + sum(map(len, items)), "the sum filter's result")
    return _charge(kind(itertools.chain(start, *items)))


def _bounded_filters(filters: dict) -> dict:
    from jinja2.utils import pass_environment, pass_eval_context

    bounded = {name: _bounded_filter(name, f) for name, f in filters.items()}
    bounded.update(batch=_batch, slice=_slice, join=pass_eval_context(_join), sum=pass_environment(_sum))
    return bounded


# -- what transformers' apply_chat_template gives a template (utils/chat_template_utils.py, transformers 5.x) ------

def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' tojson: json.dumps in the given key order, non-ASCII kept, and a plain string (jinja's own
    sorts keys, escapes ' & < > as \\uXXXX and returns Markup, which HTML-escapes what is added to it)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format: str) -> str:  # noqa: A002 (transformers' argument name)
    """The local time, formatted (gpt-oss's and Llama 3's templates date their system message with it)."""
    from datetime import datetime

    return datetime.now().strftime(str(format)[:200])


def _namespace_class():
    """jinja's namespace, refusing underscore-prefixed attributes as transformers' does (no reaching CPython's
    internals through a namespace's attributes)."""
    from jinja2.exceptions import SecurityError
    from jinja2.utils import Namespace

    def check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"chat templates cannot store underscore-prefixed attributes on a namespace ({name!r})")

    class TemplateNamespace(Namespace):
        def __init__(*args, **kwargs):  # Namespace's own signature trick: namespace(self=...) still works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                check(name)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            check(name)
            Namespace.__setitem__(self, name, value)

    return TemplateNamespace


def _generation_block():
    """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens for training masks):
    here the block renders its body, as transformers renders it when no mask is asked for."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return Generation


def _bounded_environment():
    """jinja's immutable sandbox with every way to build past the cap checked first (see the module's doc)."""
    from jinja2.runtime import LoopContext, Macro
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
    from markupsafe import Markup

    class BoundedFields:
        """str.format's fields: each one's width and text added up before it is formatted."""

        def vformat(self, format_string, args, kwargs):
            self.length = len(format_string)
            return super().vformat(format_string, args, kwargs)

        def convert_field(self, value, conversion):  # {0!r} prints its value before format_field sees it
            if conversion is not None:
                _length_of(value)
            return super().convert_field(value, conversion)

        def format_field(self, value, format_spec):
            self.length += _spec_width(format_spec) + _text_size(value, _budget().cap)
            _fits(self.length, "a str.format result")
            return super().format_field(value, format_spec)

    class Formatter(BoundedFields, SandboxedFormatter):
        pass

    class EscapeFormatter(BoundedFields, SandboxedEscapeFormatter):
        pass

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "+", "%"])

        def call_binop(self, context, operator, left, right):
            # two short strings glued together (most of a real template's operators) cannot pass the cap
            if not (operator == "+" and type(left) is str and type(right) is str and len(left) + len(right) <= _LARGE):
                _check_binop(operator, left, right)
            return _charge(self.binop_table[operator](left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
            _budget().step()  # a macro's, caller()'s or loop()'s recursion repeats work as a loop does
            if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level: its items are steps too
                args = (_Steps(args[0]), *args[1:])
            args = _check_call(__obj, args, kwargs)
            result = super().call(__context, __obj, *args, **kwargs)
            if isinstance(__obj, Macro):
                return result  # its text was charged as it was joined (concat)
            return _charge(result, deep=isinstance(getattr(__obj, "__self__", None), (str, bytes)))

        def concat(self, parts):
            """The text of a macro, a {% set %} block or a {% filter %} block, measured before it is joined."""
            parts = list(parts)
            _fits(sum(map(len, parts)), "a block's text")
            return _charge("".join(parts))

        def wrap_str_format(self, value):
            """jinja's sandboxed str.format / format_map, with each field measured (Formatter above)."""
            if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) \
                    or value.__name__ not in ("format", "format_map") or not isinstance(value.__self__, str):
                return None
            owner, is_map = value.__self__, value.__name__ == "format_map"
            formatter = EscapeFormatter(self, escape=owner.escape) if isinstance(owner, Markup) else Formatter(self)

            def wrapper(*args, **kwargs):
                if is_map:
                    if kwargs or len(args) != 1:
                        raise TypeError("format_map() takes exactly one positional argument")
                    args, kwargs = (), args[0]
                return _charge(type(owner)(formatter.vformat(owner, args, kwargs)))

            return functools.update_wrapper(wrapper, value)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, finalize=_finalize, undefined=_bounded_undefined(),
                  extensions=["jinja2.ext.loopcontrols", _generation_block()])
    env.filters = _bounded_filters({**env.filters, "tojson": tojson})
    env.filters.update({_STEPS_FILTER: _Steps, _SLICE_FILTER: _sliced, _COMPARED_FILTER: _compared})
    env.globals.update(raise_exception=_raise, range=_range, lipsum=_lipsum, strftime_now=strftime_now,
                       namespace=_namespace_class())
    return env


def compile_template(source: str):
    """The chat template compiled in the bounded sandbox, its loops and slices instrumented (a BundleError if it
    does not compile)."""
    env = _bounded_environment()
    try:  # jinja's from_string, instrumented between parsing and compiling
        code = env.compile(_instrument(env.parse(source), env))
        template = env.template_class.from_code(env, code, env.make_globals(None), None)
    except Exception as exc:  # TemplateSyntaxError, RecursionError on deep nesting...
        raise BundleError(f"the bundle's chat template does not compile ({type(exc).__name__}: "
                          f"{str(exc)[:160]})") from None
    # `~` compiles to str_join / markup_join, names the compiled module imports from jinja2.runtime
    template.root_render_func.__globals__.update(str_join=_str_join, markup_join=_markup_join)
    return template


def render_template(template, messages: list[dict], cap: int, **variables) -> str:
    """The template rendered within its limits, with a fresh budget in this thread's context (so that renders
    in other threads, or one inside another, count their own)."""
    token = _RENDER.set(_Budget(cap))
    try:
        out, size = [], 0
        for chunk in template.generate(**variables, messages=messages):
            out.append(chunk)
            size += len(chunk)
            if size > cap:
                raise _over(f"its output passed {cap} characters")
        return "".join(out)
    except TemplateError:
        raise
    except Exception as exc:
        raise TemplateError(f"chat template failed: {str(exc)[:500]}") from None
    finally:
        _RENDER.reset(token)


def render_cap(messages: list[dict]) -> int:
    return RENDER_CHARS + 2 * sum(len(m["content"]) for m in messages)  # the messages, plus room to wrap them


def check_template(source: str, conversations, tokenizer_config: dict) -> None:
    """Render the template on each (messages, variables) as a bundle would, so that conversion can refuse one
    that goes past the render's limits: raises that TemplateError (`limit` set). A template that does not
    compile, or fails on a sample otherwise (one that raises on a system message, or wants alternating turns),
    passes: the runtime reports those on the conversations it meets."""
    try:
        template = compile_template(source)
    except BundleError:
        return
    bos, eos = (token_text(tokenizer_config.get(key)) or "" for key in ("bos_token", "eos_token"))
    for messages, variables in conversations:
        try:
            render_template(template, messages, render_cap(messages), **variables, add_generation_prompt=True,
                            bos_token=bos, eos_token=eos)
        except TemplateError as exc:
            if exc.limit:
                raise


def token_text(token) -> str | None:
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None
