"""llama.cpp's chat-parser test cases, read from its C++ source as Python data.

Reads the text of llama.cpp's `tests/test-chat.cpp` and returns the cases of its PEG parser tests: for each
`tst.test(TEXT).setter(...)....run();` chain on a tester made with `peg_tester("models/templates/X.jinja", ...)`,
the model's answer TEXT (what it generates after the prompt), the request settings and the message the parser
must read from it. specrt's tests feed each case's text to specrt's own tool-call readers. The cases are
llama.cpp's (MIT license, The ggml authors); this module only reads them.

    python tests/llamacpp_chat_cases.py PATH/test-chat.cpp   ->  per template, the cases read and the chains skipped

How it reads: a small tokenizer for the C++ it needs (string literals with their escapes, raw strings, adjacent
literals joined, identifiers with `::` joined, numbers, punctuation; comments and preprocessor lines dropped), then
a walk over every function body that keeps the local names in `{ ... }` scopes: testers (`auto tst =
peg_tester(PATH, ...)`), strings (`const std::string x = "..." "..."`, `const char * x = R"(...)"`) and messages
(`auto m = simple_assist_msg(...)`). Loops over a braced list of strings (`for (const auto & path : {"a", "b"})`)
run their body once per string; a function that makes its tester from a parameter (`test_lfm2_parser(
template_path, ...)`) is read at each call, with the call's arguments. Tools are the file's `static
common_chat_tool NAME{ "name", "description", R"({schema})" }` definitions or the same braces written inline;
named messages are `const common_chat_msg NAME = helper(...)` where the helper is one of the file's functions that
return a common_chat_msg from parameters named content, reasoning(_content), tool_name, arguments, id and
tool_calls (simple_assist_msg and its wrappers, lines ~980-1082 of the C++). A chain that needs anything else is
skipped and reported, not guessed.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

# ---------------------------------------------------------------------------------------------------------------
# The data


@dataclass(frozen=True)
class Tool:
    """One `common_chat_tool`: its name, description and JSON schema of parameters (parsed)."""

    name: str
    description: str
    parameters: dict


@dataclass(frozen=True)
class Expected:
    """The message the parser must read. calls: (name, arguments as written in the C++, id) per tool call. The C++
    (assert_msg_equals(..., true)) compares content and reasoning with surrounding whitespace stripped, arguments
    as JSON (parsed and dumped again; two texts that are not JSON, such as cut-off arguments, compare equal) and
    names and ids exactly."""

    content: str = ""
    reasoning: str = ""
    calls: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class Case:
    template: str  # the template's file name, e.g. "Qwen3.5-4B.jinja"
    line: int  # line of the `tst.test(` call in the C++ (shared by the templates of a loop or helper)
    text: str  # the model's answer: what it generates after the prompt
    reasoning_format: str | None  # "AUTO", "NONE", "DEEPSEEK", ... (COMMON_REASONING_FORMAT_*); None: not set
    enable_thinking: bool | None  # None: not set (the C++ default applies)
    tools: tuple[Tool, ...]
    parallel_tool_calls: bool | None
    tool_choice: str | None  # "REQUIRED", "AUTO", "NONE" (COMMON_CHAT_TOOL_CHOICE_*); None: not set
    json_schema: str | None
    is_partial: bool  # the text is cut off: the parser reads it as an unfinished generation
    # names of the setters used that the fields above do not hold ("messages", "continue_final_message",
    # "add_generation_prompt", "expect_reconstruction", ...), in call order: a caller skips cases it does not model
    other: tuple[str, ...]
    expected: Expected


# ---------------------------------------------------------------------------------------------------------------
# The tokenizer


@dataclass(frozen=True)
class Token:
    kind: str  # "str" (a string literal, decoded), "char", "num", "ident" (with `::` joined), "punct" or "eof"
    value: str
    line: int


_IDENT = re.compile(r"[A-Za-z_]\w*")
_NUMBER = re.compile(r"\d[\w.]*")
_PUNCTUATION = ["<<=", ">>=", "...", "::", "->", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "++", "--",
                "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^="]
_STRING_PREFIXES = {"L", "u", "U", "u8"}  # before `"` or `'`; with an R after them (or R alone): a raw string
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "\\": "\\",
                   "'": "'", '"': '"', "?": "?"}
_OCTAL = "01234567"
_HEX = "0123456789abcdefABCDEF"


def decode_escapes(body: str, line: int) -> str:
    """The text of a C++ narrow string literal's body. \\x and octal escapes are bytes, \\u and \\U code points
    (written as UTF-8), like the compiler does for a UTF-8 source; the bytes are read back as UTF-8."""
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8", errors="surrogateescape")
            i += 1
            continue
        e = body[i + 1] if i + 1 < len(body) else ""
        if e in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[e].encode()
            i += 2
        elif e == "x":
            j = i + 2
            while j < len(body) and body[j] in _HEX:  # C++ takes every hex digit that follows
                j += 1
            if j == i + 2 or int(body[i + 2:j], 16) > 0xFF:
                raise ValueError(f"line {line}: bad \\x escape in a string literal")
            out.append(int(body[i + 2:j], 16))
            i = j
        elif e in _OCTAL:
            j = i + 1
            while j < len(body) and j < i + 4 and body[j] in _OCTAL:
                j += 1
            if int(body[i + 1:j], 8) > 0xFF:
                raise ValueError(f"line {line}: bad octal escape in a string literal")
            out.append(int(body[i + 1:j], 8))
            i = j
        elif e in ("u", "U"):
            width = 4 if e == "u" else 8
            digits = body[i + 2:i + 2 + width]
            if len(digits) != width or any(d not in _HEX for d in digits):
                raise ValueError(f"line {line}: bad \\{e} escape in a string literal")
            out += chr(int(digits, 16)).encode("utf-8", errors="surrogatepass")
            i += 2 + width
        else:
            raise ValueError(f"line {line}: unknown escape \\{e} in a string literal")
    return out.decode("utf-8", errors="surrogateescape")


def _skip_comment(text: str, i: int) -> int:
    """The index after the comment that starts at i (`//` to the end of the line, or `/* ... */`)."""
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    end = text.find("*/", i + 2)
    if end < 0:
        raise ValueError("unterminated /* comment")
    return end + 2


def _skip_preprocessor(text: str, i: int) -> int:
    """The index of the newline that ends the preprocessor line starting at i (continuation lines included)."""
    while True:
        end = text.find("\n", i)
        if end < 0:
            return len(text)
        if text[end - 1] != "\\":
            return end
        i = end + 1


def _read_quoted(text: str, i: int, line: int) -> tuple[str, int]:
    """The body of the quoted literal whose opening quote is at i, escapes left as written, and the index after its
    closing quote."""
    quote = text[i]
    j = i + 1
    while j < len(text) and text[j] != quote:
        if text[j] == "\n":
            raise ValueError(f"line {line}: newline inside a quoted literal")
        j += 2 if text[j] == "\\" else 1
    if j >= len(text):
        raise ValueError(f"line {line}: unterminated literal")
    return text[i + 1:j], j + 1


def _read_raw_string(text: str, i: int, line: int) -> tuple[str, int]:
    """The body of the raw string R"delim(...)delim" whose opening quote is at i, and the index after it."""
    open_paren = text.find("(", i)
    if open_paren < 0 or open_paren - i - 1 > 16:
        raise ValueError(f"line {line}: bad raw string delimiter")
    delimiter = text[i + 1:open_paren]
    closing = ")" + delimiter + '"'
    end = text.find(closing, open_paren + 1)
    if end < 0:
        raise ValueError(f"line {line}: unterminated raw string")
    return text[open_paren + 1:end], end + len(closing)


def _read_identifier(text: str, i: int) -> tuple[str, int]:
    """An identifier at i with any `::name` parts that follow it joined on (`std::string`), and the index after."""
    end = _IDENT.match(text, i).end()
    while text.startswith("::", end) and _IDENT.match(text, end + 2):
        end = _IDENT.match(text, end + 2).end()
    return text[i:end], end


def _join_adjacent_strings(tokens: list[Token]) -> list[Token]:
    """"a" "b" -> "ab", as the compiler joins adjacent string literals."""
    joined: list[Token] = []
    for token in tokens:
        if token.kind == "str" and joined and joined[-1].kind == "str":
            joined[-1] = Token("str", joined[-1].value + token.value, joined[-1].line)
        else:
            joined.append(token)
    return joined


def tokenize(text: str) -> list[Token]:
    """The tokens of C++ source, ending with an "eof" token."""
    tokens: list[Token] = []
    i, line, line_start = 0, 1, True
    while i < len(text):
        c = text[i]
        start = i
        if c == "\n":
            line, line_start, i = line + 1, True, i + 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if text.startswith("//", i) or text.startswith("/*", i):
            i = _skip_comment(text, i)
        elif c == "#" and line_start:
            i = _skip_preprocessor(text, i)
        elif _IDENT.match(text, i):
            name, i = _read_identifier(text, i)
            if name in _STRING_PREFIXES and i < len(text) and text[i] in "\"'":
                quote = text[i]
                body, i = _read_quoted(text, i, line)
                tokens.append(Token("str" if quote == '"' else "char", decode_escapes(body, line), line))
            elif name[-1] == "R" and name[:-1] in _STRING_PREFIXES | {""} and i < len(text) and text[i] == '"':
                body, i = _read_raw_string(text, i, line)
                tokens.append(Token("str", body, line))
            else:
                tokens.append(Token("ident", name, line))
        elif c in "\"'":
            body, i = _read_quoted(text, i, line)
            tokens.append(Token("str" if c == '"' else "char", decode_escapes(body, line), line))
        elif c.isdigit() or (c == "." and text[i + 1:i + 2].isdigit()):
            i = _NUMBER.match(text, i + (c == ".")).end()
            tokens.append(Token("num", text[start:i], line))
        else:
            punct = next((p for p in _PUNCTUATION if text.startswith(p, i)), c)
            i += len(punct)
            tokens.append(Token("punct", punct, line))
        line += text.count("\n", start, i)
        line_start = False
    tokens.append(Token("eof", "", line))
    return _join_adjacent_strings(tokens)


# ---------------------------------------------------------------------------------------------------------------
# Token-list helpers

_OPENERS = {"(": ")", "{": "}", "[": "]"}
_CLOSERS = {")", "}", "]"}


def match_close(tokens: list[Token], i: int) -> int:
    """The index of the bracket that closes the one at i (round, curly and square brackets nest)."""
    depth = 0
    for j in range(i, len(tokens)):
        value = tokens[j].value if tokens[j].kind == "punct" else ""
        if value in _OPENERS:
            depth += 1
        elif value in _CLOSERS:
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"line {tokens[i].line}: unclosed {tokens[i].value!r}")


def split_top_level(tokens: list[Token], separator: str, angle: bool = False) -> list[list[Token]]:
    """The parts of a token list between separators outside brackets; a trailing separator ends no empty part.
    angle: `<` and `>` are brackets too (a type such as std::pair<std::string, std::string>)."""
    parts: list[list[Token]] = [[]]
    depth = 0
    for token in tokens:
        value = token.value if token.kind == "punct" else ""
        if value == separator and depth == 0:
            parts.append([])
            continue
        if value in _OPENERS or (angle and value == "<"):
            depth += 1
        elif value in _CLOSERS or (angle and value == ">"):
            depth -= 1
        elif angle and value == ">>":
            depth -= 2
        parts[-1].append(token)
    if not parts[-1]:
        parts.pop()
    return parts


def statement_end(tokens: list[Token], i: int) -> int:
    """The index of the `;` that ends the statement going on at i (outside brackets)."""
    j = i
    while tokens[j].kind != "eof" and not (tokens[j].kind == "punct" and tokens[j].value == ";"):
        j = match_close(tokens, j) + 1 if tokens[j].kind == "punct" and tokens[j].value in _OPENERS else j + 1
    return j


def source_of(tokens: list[Token]) -> str:
    """A short rendering of tokens, for messages."""
    text = " ".join(json.dumps(t.value) if t.kind == "str" else t.value for t in tokens)
    return text if len(text) <= 60 else text[:57] + "..."


def _is(token: Token, value: str) -> bool:
    return token.kind == "punct" and token.value == value


# ---------------------------------------------------------------------------------------------------------------
# The C++ that is read: declarations, functions, expressions


class Unresolved(Exception):
    """An expression this reader does not evaluate; its message says why."""


@dataclass(frozen=True)
class Enum:
    """A bare upper-case identifier, such as COMMON_REASONING_FORMAT_AUTO."""

    name: str


@dataclass(frozen=True)
class Tester:
    """A `peg_tester`: its template's file name, or why it is not known."""

    template: str | None
    reason: str = ""


@dataclass(frozen=True)
class Function:
    name: str
    return_type: str  # the token before the name
    params: tuple[tuple[str, tuple[Token, ...] | None], ...]  # (name, default value's tokens or None)
    body: tuple[int, int]  # indexes of its `{` and `}`


@dataclass(frozen=True)
class Declaration:
    type: str  # "auto", "std::string", "char", "common_chat_msg", "common_chat_tool", "common_chat_tool_call"
    name: str
    init: list[Token] | None  # the value's tokens (a braced initializer keeps its braces); None: none given
    end: int  # the index after the declaration


@dataclass(frozen=True)
class Call:
    """One `.name(args)` of a chain."""

    name: str
    args: list[list[Token]]
    line: int


# the parameters of the message helpers (simple_assist_msg and its wrappers) and the field of the message each
# fills; a helper's C++ body builds the message from them: content, reasoning, the pairs of tool_calls (name,
# arguments, id "") and one more call (tool_name, arguments, id) when tool_name or id is not empty
HELPER_PARAMS = {"content": "content", "reasoning_content": "reasoning", "reasoning": "reasoning",
                 "tool_name": "name", "arguments": "arguments", "id": "id", "tool_calls": "pairs"}
DECLARED_TYPES = {"auto", "std::string", "char", "common_chat_msg", "common_chat_tool", "common_chat_tool_call"}
QUALIFIERS = {"const", "static", "constexpr", "inline"}
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "catch", "decltype", "static_assert", "operator"}


def parse_declaration(tokens: list[Token], i: int) -> Declaration | None:
    """A declaration of one of DECLARED_TYPES starting at i (`const std::string x = ...;`, `common_chat_tool
    t{...};`, `common_chat_msg m;`), or None."""
    j = i
    while tokens[j].kind == "ident" and tokens[j].value in QUALIFIERS:
        j += 1
    if tokens[j].kind != "ident" or tokens[j].value not in DECLARED_TYPES:
        return None
    type_name = tokens[j].value
    j += 1
    while tokens[j].value in ("*", "&", "const") and tokens[j].kind in ("punct", "ident"):
        j += 1
    if tokens[j].kind != "ident":
        return None
    name = tokens[j].value
    after = tokens[j + 1]
    if _is(after, "="):
        end = statement_end(tokens, j + 2)
        return Declaration(type_name, name, tokens[j + 2:end], end + 1)
    if _is(after, "{"):
        close = match_close(tokens, j + 1)
        end = close + 2 if _is(tokens[close + 1], ";") else close + 1
        return Declaration(type_name, name, tokens[j + 1:close + 1], end)
    if _is(after, ";"):
        return Declaration(type_name, name, None, j + 2)
    return None


def parse_params(tokens: list[Token]) -> tuple[tuple[str, tuple[Token, ...] | None], ...]:
    """(name, default value's tokens or None) of each parameter of a parameter list (its parentheses left out)."""
    params = []
    for part in split_top_level(tokens, ",", angle=True):
        eq = next((k for k, t in enumerate(part) if _is(t, "=")), len(part))
        names = [t.value for t in part[:eq] if t.kind == "ident" and t.value not in QUALIFIERS]
        params.append((names[-1] if names else "", tuple(part[eq + 1:]) if eq < len(part) else None))
    return tuple(params)


def parse_function(tokens: list[Token], i: int) -> Function | None:
    """A function definition whose name is at i (`name(params) [const] { body }`), or None."""
    name = tokens[i]
    if name.kind != "ident" or name.value in KEYWORDS or not _is(tokens[i + 1], "("):
        return None
    close = match_close(tokens, i + 1)
    j = close + 1
    while tokens[j].kind == "ident" and tokens[j].value in ("const", "noexcept", "override"):
        j += 1
    if not _is(tokens[j], "{"):
        return None
    return_type = tokens[i - 1].value if i > 0 else ""
    return Function(name.value, return_type, parse_params(tokens[i + 2:close]), (j, match_close(tokens, j)))


def template_name(path: str) -> str:
    """"models/templates/Qwen3.5-4B.jinja" -> "Qwen3.5-4B.jinja"."""
    return path.rsplit("/", 1)[-1]


class Reader:
    """Reads the cases of one C++ file: first its top level (functions, tools, messages), then every function
    body, keeping the local names of each `{ ... }` in a scope (a dict; the innermost last)."""

    def __init__(self, cpp_text: str, templates: set[str] | None):
        self.tokens = tokenize(cpp_text)
        self.templates = templates
        self.functions: dict[str, Function] = {}
        self.tester_functions: set[str] = set()  # functions that make their tester from a parameter
        self.globals: dict[str, object] = {}
        self.cases: list[Case] = []
        self.skipped: list[tuple[int, str]] = []
        self.depth = 0  # nesting of helper-function reads, against recursion

    # --- the top level

    def read(self) -> list[Case]:
        self.read_top_level()
        self.tester_functions = {f.name for f in self.functions.values() if self.makes_tester_from_param(f)}
        for function in self.functions.values():
            if function.name not in self.tester_functions:
                self.walk(function.body[0], function.body[1] + 1, [self.globals, {}])
        return self.cases

    def read_top_level(self) -> None:
        """Record the file's functions and evaluate its global declarations, skipping class bodies and the
        like."""
        tokens = self.tokens
        i = 0
        while tokens[i].kind != "eof":
            declaration = parse_declaration(tokens, i) if self.at_statement_start(i) else None
            if declaration is not None:
                self.globals[declaration.name] = self.evaluate_declaration(declaration, [self.globals])
                i = declaration.end
                continue
            function = parse_function(tokens, i)
            if function is not None:
                self.functions.setdefault(function.name, function)
                i = function.body[1] + 1
            elif _is(tokens[i], "{"):
                i = match_close(tokens, i) + 1
            else:
                i += 1

    def at_statement_start(self, i: int) -> bool:
        """Whether a statement can start at i: after `;`, a brace, `)` (of an if or for) or else."""
        if i == 0:
            return True
        before = self.tokens[i - 1]
        return (before.kind == "punct" and before.value in (";", "{", "}", ")")) or before.value in ("else", "do")

    def makes_tester_from_param(self, function: Function) -> bool:
        """Whether the function makes a peg_tester from one of its parameters (read at its calls, not alone)."""
        names = {name for name, _ in function.params}
        first, last = function.body
        return any(self.tokens[k].value == "peg_tester" and _is(self.tokens[k + 1], "(")
                   and self.tokens[k + 2].value in names and self.tokens[k + 2].kind == "ident"
                   for k in range(first, last))

    def message_helper(self, name: str) -> Function | None:
        """The function `name` if it is a message helper: returns a common_chat_msg from HELPER_PARAMS."""
        function = self.functions.get(name)
        if function is None or function.return_type != "common_chat_msg":
            return None
        if not function.params or any(param not in HELPER_PARAMS for param, _ in function.params):
            return None
        return function

    # --- function bodies

    def walk(self, start: int, end: int, scopes: list[dict]) -> None:
        """Read the statements of tokens[start:end]: scopes, loops, declarations, test chains, helper calls."""
        scopes = list(scopes)
        base = len(scopes)
        tokens = self.tokens
        i = start
        while i < end:
            token = tokens[i]
            if _is(token, "{"):
                scopes.append({})
                i += 1
            elif _is(token, "}"):
                if len(scopes) > base:
                    scopes.pop()
                i += 1
            elif token.kind == "ident" and token.value == "for" and _is(tokens[i + 1], "("):
                i = self.walk_for(i, scopes)
            elif self.at_statement_start(i) and parse_declaration(tokens, i) is not None:
                declaration = parse_declaration(tokens, i)
                scopes[-1][declaration.name] = self.evaluate_declaration(declaration, scopes)
                self.note_hidden_chains(i, declaration.end, scopes)
                i = declaration.end
            elif token.kind == "ident":
                i = self.walk_name(i, scopes)
            else:
                i += 1

    def walk_name(self, i: int, scopes: list[dict]) -> int:
        """A name: a test chain `tst.test(...)...;`, or at the start of a statement a call of a tester-making
        function or a change to a local value. Returns where to go on (the next token when it is none of these)."""
        tokens = self.tokens
        name = tokens[i].value
        value = self.lookup_quietly(name, scopes)
        if isinstance(value, Tester) and self.is_chain(i):
            return self.read_chain(i, value, scopes)
        if not self.at_statement_start(i):
            return i + 1
        if name in self.tester_functions and _is(tokens[i + 1], "("):
            self.call_tester_function(self.functions[name], i, scopes)
            return statement_end(tokens, i) + 1
        if tokens[i + 1].kind == "punct" and tokens[i + 1].value in (".", "=", "+="):
            self.note_change(name, i, scopes)
        return i + 1

    def is_chain(self, i: int) -> bool:
        return _is(self.tokens[i + 1], ".") and self.tokens[i + 2].value == "test" and _is(self.tokens[i + 3], "(")

    def note_hidden_chains(self, start: int, end: int, scopes: list[dict]) -> None:
        """Test chains inside a declaration's value (a lambda, say) are not read: note them as skipped."""
        for k in range(start, end):
            value = self.lookup_quietly(self.tokens[k].value, scopes) if self.tokens[k].kind == "ident" else None
            if isinstance(value, Tester) and self.is_chain(k) and self.wanted(value):
                self.skipped.append((self.tokens[k].line, f"{value.template or '(unknown template)'}: "
                                                          "a chain inside a declaration's value (a lambda?)"))

    def wanted(self, tester: Tester) -> bool:
        return tester.template is None or self.templates is None or tester.template in self.templates

    def walk_for(self, i: int, scopes: list[dict]) -> int:
        """`for (DECL NAME : { "a", "b" }) BODY`: the body read once per string with NAME bound to it. Another
        range-for reads its body once with NAME unknown; a counted for is read as plain statements."""
        tokens = self.tokens
        close = match_close(tokens, i + 1)
        header = split_top_level(tokens[i + 2:close], ":")
        if len(header) != 2 or any(_is(t, ";") for t in tokens[i + 2:close]):
            return i + 1
        variable = header[0][-1].value
        body_start = close + 1
        body_end = match_close(tokens, body_start) + 1 if _is(tokens[body_start], "{") else \
            statement_end(tokens, body_start) + 1
        try:
            values = self.evaluate(header[1], scopes)
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise Unresolved("the loop is not over a braced list of strings")
        except Unresolved as e:
            values = [Unresolved(f"loop variable {variable}: {e}")]
        for value in values:
            self.walk(body_start, body_end, [*scopes, {variable: value}])
        return body_end

    def call_tester_function(self, function: Function, i: int, scopes: list[dict]) -> None:
        """Read the body of a function that makes a tester from a parameter, with the call's arguments bound."""
        close = match_close(self.tokens, i + 1)
        args = split_top_level(self.tokens[i + 2:close], ",")
        if self.depth > 8:
            self.skipped.append((self.tokens[i].line, f"(unknown template): {function.name} calls nest too deep"))
            return
        bound = {}
        for k, (param, default) in enumerate(function.params):
            source = args[k] if k < len(args) else list(default or [])
            bound[param] = self.evaluate_quietly(source, scopes) if source else Unresolved(f"no argument {param}")
        self.depth += 1
        self.walk(function.body[0], function.body[1] + 1, [self.globals, bound])
        self.depth -= 1

    def note_change(self, name: str, i: int, scopes: list[dict]) -> None:
        """`x = ...;` re-evaluates a local value; `x += ...`, `x.field = ...` and the like make it unknown."""
        for scope in reversed(scopes[1:]):
            if name in scope:
                if isinstance(scope[name], Tester):
                    return
                if _is(self.tokens[i + 1], "="):
                    end = statement_end(self.tokens, i + 2)
                    scope[name] = self.evaluate_quietly(self.tokens[i + 2:end], scopes)
                else:
                    scope[name] = Unresolved(f"{name} is changed after its declaration (line {self.tokens[i].line})")
                return

    # --- test chains

    def read_chain(self, i: int, tester: Tester, scopes: list[dict]) -> int:
        """Read `tst.test(...)....run();` starting at i into a case, or note it as skipped. Returns the index
        after the statement."""
        tokens = self.tokens
        line = tokens[i].line
        calls, j = self.parse_chain(i + 1)
        end = statement_end(tokens, j) + 1
        if not self.wanted(tester):
            return end
        if tester.template is None:
            self.skipped.append((line, f"(unknown template): {tester.reason}"))
            return end
        if calls[-1].name != "run" or not _is(tokens[j], ";"):
            self.skipped.append((line, f"{tester.template}: the chain does not end with .run();"))
            return end
        try:
            self.cases.append(self.build_case(tester.template, line, calls, scopes))
        except Unresolved as e:
            self.skipped.append((line, f"{tester.template}: {e}"))
        return end

    def parse_chain(self, i: int) -> tuple[list[Call], int]:
        """The `.name(args)` calls starting at i, and the index after the last."""
        tokens = self.tokens
        calls = []
        while _is(tokens[i], ".") and tokens[i + 1].kind == "ident" and _is(tokens[i + 2], "("):
            close = match_close(tokens, i + 2)
            calls.append(Call(tokens[i + 1].value, split_top_level(tokens[i + 3:close], ","), tokens[i + 1].line))
            i = close + 1
        return calls, i

    def build_case(self, template: str, line: int, calls: list[Call], scopes: list[dict]) -> Case:
        """The case of a chain: test(text), then the setters in order (a later one overrides), then run()."""
        fields: dict = {"reasoning_format": None, "enable_thinking": None, "tools": (), "parallel_tool_calls": None,
                        "tool_choice": None, "json_schema": None, "is_partial": False}
        other: list[str] = []
        text = self.as_str(self.single_arg(calls[0], scopes))
        expected = Expected()
        for call in calls[1:-1]:
            expected = self.apply_setter(call, fields, expected, other, scopes)
        return Case(template=template, line=line, text=text, other=tuple(other), expected=expected, **fields)

    def apply_setter(self, call: Call, fields: dict, expected: Expected, other: list[str],
                     scopes: list[dict]) -> Expected:
        """Apply one setter of the C++ builder (peg_test_builder) to fields or the expected message; returns the
        expected message. Setters the Case fields do not hold go to other, their arguments unread."""
        name = call.name
        if name == "reasoning_format":
            fields[name] = self.as_enum(self.single_arg(call, scopes), "COMMON_REASONING_FORMAT_")
        elif name == "tool_choice":
            fields[name] = self.as_enum(self.single_arg(call, scopes), "COMMON_CHAT_TOOL_CHOICE_")
        elif name in ("enable_thinking", "parallel_tool_calls", "is_partial"):
            fields[name] = self.as_bool(self.single_arg(call, scopes))
        elif name == "tools":
            fields[name] = tuple(self.as_tool(t) for t in self.as_list(self.single_arg(call, scopes)))
        elif name == "json_schema":
            fields[name] = self.as_str(self.single_arg(call, scopes))
        elif name == "expect":
            return self.as_message(self.single_arg(call, scopes))
        elif name == "expect_content":
            return replace(expected, content=self.as_str(self.single_arg(call, scopes)))
        elif name == "expect_reasoning":
            return replace(expected, reasoning=self.as_str(self.single_arg(call, scopes)))
        elif name == "expect_tool_calls":
            return replace(expected, calls=self.as_calls(self.single_arg(call, scopes)))
        elif name not in other:
            other.append(name)
        return expected

    def single_arg(self, call: Call, scopes: list[dict]) -> object:
        if len(call.args) != 1:
            raise Unresolved(f".{call.name}() with {len(call.args)} arguments")
        return self.evaluate(call.args[0], scopes)

    # --- expressions

    def lookup_quietly(self, name: str, scopes: list[dict]) -> object:
        for scope in reversed(scopes):
            if name in scope:
                return scope[name]
        return None

    def lookup(self, name: str, scopes: list[dict]) -> object:
        for scope in reversed(scopes):
            if name in scope:
                value = scope[name]
                if isinstance(value, Unresolved):
                    raise Unresolved(f"{name}: {value}")
                return value
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            return Enum(name)
        raise Unresolved(f"unknown name {name}")

    def evaluate_quietly(self, tokens: list[Token], scopes: list[dict]) -> object:
        """The value of an expression, or its Unresolved (kept in a scope until the name is used)."""
        try:
            return self.evaluate(tokens, scopes)
        except Unresolved as e:
            return e

    def evaluate_declaration(self, declaration: Declaration, scopes: list[dict]) -> object:
        init, type_name = declaration.init, declaration.type
        if init is None:
            return Unresolved("declared without a value (set field by field?)")
        if type_name == "common_chat_msg" and _is(init[0], "{"):
            return Unresolved("a message written as an initializer list, not a helper call")
        value = self.evaluate_quietly(init, scopes)
        if isinstance(value, Unresolved):
            return value
        try:
            if type_name in ("std::string", "char"):
                return self.as_str(value)
            if type_name == "common_chat_msg":
                return self.as_message(value)
            if type_name == "common_chat_tool":
                return self.as_tool(value)
        except Unresolved as e:
            return e
        return value

    def evaluate(self, tokens: list[Token], scopes: list[dict]) -> object:
        """The value of an expression: str, bool, int, list (a braced list), Tool, Expected (a message), Tester or
        Enum. Raises Unresolved for anything else."""
        if not tokens:
            raise Unresolved("an empty expression")
        parts = split_top_level(tokens, "+")
        if len(parts) > 1:
            values = [self.evaluate(part, scopes) for part in parts]
            if not all(isinstance(v, str) for v in values):
                raise Unresolved(f"+ of something other than strings: {source_of(tokens)}")
            return "".join(values)
        return self.evaluate_term(tokens, scopes)

    def evaluate_term(self, tokens: list[Token], scopes: list[dict]) -> object:
        first = tokens[0]
        if len(tokens) == 1:
            return self.evaluate_atom(first, scopes)
        if _is(first, "{") and match_close(tokens, 0) == len(tokens) - 1:
            return [self.evaluate(part, scopes) for part in split_top_level(tokens[1:-1], ",")]
        if first.kind == "ident" and len(tokens) > 2 and tokens[1].value in ("(", "{") and tokens[1].kind == "punct" \
                and match_close(tokens, 1) == len(tokens) - 1:
            args = split_top_level(tokens[2:-1], ",")
            return self.evaluate_call(first.value, tokens[1].value, args, scopes)
        raise Unresolved(f"cannot read the expression {source_of(tokens)}")

    def evaluate_atom(self, token: Token, scopes: list[dict]) -> object:
        if token.kind == "str":
            return token.value
        if token.kind == "num" and token.value.isdigit():
            return int(token.value)
        if token.kind == "ident" and token.value in ("true", "false"):
            return token.value == "true"
        if token.kind == "ident":
            return self.lookup(token.value, scopes)
        raise Unresolved(f"cannot read {token.value!r}")

    def evaluate_call(self, name: str, bracket: str, args: list[list[Token]], scopes: list[dict]) -> object:
        """name(args) or name{args}: a string wrapper, a tester, a message helper or a braced type."""
        if name in ("std::string", "std::string_view") and bracket == "(" and len(args) == 1:
            return self.as_str(self.evaluate(args[0], scopes))
        if name == "peg_tester" and bracket == "(" and args:
            return self.make_tester(args[0], scopes)
        if name in ("common_chat_tool", "common_chat_tool_call") and bracket == "{":
            return [self.evaluate(arg, scopes) for arg in args]
        helper = self.message_helper(name) if bracket == "(" else None
        if helper is not None:
            return self.call_message_helper(helper, [self.evaluate(arg, scopes) for arg in args])
        raise Unresolved(f"a call of {name}, which this reader does not evaluate")

    def make_tester(self, path_tokens: list[Token], scopes: list[dict]) -> Tester:
        try:
            path = self.as_str(self.evaluate(path_tokens, scopes))
        except Unresolved as e:
            return Tester(None, f"the tester's template path: {e}")
        return Tester(template_name(path))

    def call_message_helper(self, helper: Function, args: list[object]) -> Expected:
        """The message a helper returns, from its arguments (and the defaults of the parameters left out)."""
        if len(args) > len(helper.params):
            raise Unresolved(f"{helper.name} called with {len(args)} arguments")
        values = {"content": "", "reasoning": "", "name": "", "arguments": "", "id": "", "pairs": []}
        for k, (param, default) in enumerate(helper.params):
            if k < len(args):
                value = args[k]
            elif default is not None:
                value = self.evaluate(list(default), [self.globals])
            else:
                raise Unresolved(f"{helper.name} called without its argument {param}")
            values[HELPER_PARAMS[param]] = value
        calls = [self.as_call([*pair, ""]) for pair in self.as_list(values["pairs"])]
        name, arguments, call_id = (self.as_str(values[k]) for k in ("name", "arguments", "id"))
        if name or call_id:
            calls.append((name, arguments, call_id))
        return Expected(self.as_str(values["content"]), self.as_str(values["reasoning"]), tuple(calls))

    # --- conversions of evaluated values

    def as_str(self, value: object) -> str:
        if isinstance(value, list) and not value:
            return ""  # `{}`: an empty std::string
        if not isinstance(value, str):
            raise Unresolved(f"a string was expected, not {value!r}")
        return value

    def as_bool(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise Unresolved(f"true or false was expected, not {value!r}")
        return value

    def as_list(self, value: object) -> list:
        if not isinstance(value, list):
            raise Unresolved(f"a braced list was expected, not {value!r}")
        return value

    def as_enum(self, value: object, prefix: str) -> str:
        if not isinstance(value, Enum) or not value.name.startswith(prefix):
            raise Unresolved(f"a {prefix}* value was expected, not {value!r}")
        return value.name[len(prefix):]

    def as_tool(self, value: object) -> Tool:
        if isinstance(value, Tool):
            return value
        items = self.as_list(value)
        if len(items) != 3:
            raise Unresolved(f"a tool of {len(items)} fields")
        name, description, schema = (self.as_str(item) for item in items)
        try:
            return Tool(name, description, json.loads(schema))
        except json.JSONDecodeError as e:
            raise Unresolved(f"the parameters of tool {name} are not JSON: {e}") from None

    def as_call(self, value: object) -> tuple[str, str, str]:
        items = self.as_list(value)
        if not 1 <= len(items) <= 3:
            raise Unresolved(f"a tool call of {len(items)} fields")
        name, arguments, call_id = (self.as_str(item) for item in [*items, "", ""][:3])
        return name, arguments, call_id

    def as_calls(self, value: object) -> tuple[tuple[str, str, str], ...]:
        return tuple(self.as_call(item) for item in self.as_list(value))

    def as_message(self, value: object) -> Expected:
        if not isinstance(value, Expected):
            raise Unresolved(f"a message was expected, not {value!r}")
        return value


def read_cases(cpp_text: str, templates: set[str] | None = None,
               skipped: list[tuple[int, str]] | None = None) -> list[Case]:
    """The cases of llama.cpp's test-chat.cpp (its text), in file order (a loop's or helper's cases once per
    template). templates: only testers of these template file names. skipped: if given, gets (line, reason) for
    each chain not read; the reason starts with the template's file name and a colon ("(unknown template)" when
    the tester's path could not be read)."""
    reader = Reader(cpp_text, templates)
    cases = reader.read()
    if skipped is not None:
        skipped.extend(reader.skipped)
    return cases


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python tests/llamacpp_chat_cases.py PATH/test-chat.cpp", file=sys.stderr)
        return 2
    skipped: list[tuple[int, str]] = []
    cases = read_cases(Path(argv[1]).read_text(encoding="utf-8"), skipped=skipped)
    counts: dict[str, list[int]] = {}
    for case in cases:
        counts.setdefault(case.template, [0, 0])[0] += 1
    for _, reason in skipped:
        counts.setdefault(reason.split(": ", 1)[0], [0, 0])[1] += 1
    width = max((len(name) for name in counts), default=8)
    print(f"{'template':<{width}}  cases  skipped")
    for name in sorted(counts):
        print(f"{name:<{width}}  {counts[name][0]:>5}  {counts[name][1]:>7}")
    print(f"{'total':<{width}}  {len(cases):>5}  {len(skipped):>7}")
    for line, reason in skipped:
        print(f"  skipped line {line}: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
