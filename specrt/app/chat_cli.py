"""The terminal chat loop behind `specrt chat`: streaming answers, /reset, /stats, /exit, Ctrl-C.

Reads with a prompt when stdin is a terminal and plain lines from a pipe otherwise, so that
`printf 'question\\n/exit\\n' | specrt chat` works.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specrt.errors import SpecrtError

HELP = ("commands: /reset (new conversation), /stats (last answer's numbers), /json [SCHEMA.json] (answers as JSON, "
        "fitting the schema if given), /text (plain answers again), /exit; Ctrl-C stops an answer")


class BadLine(Exception):
    """A line that is not text (invalid UTF-8): reported, and the session goes on."""


def _read_line(interactive: bool) -> str | None:
    """The next line (None at the end of input); BadLine for a line that is not valid UTF-8."""
    try:
        if interactive:
            return input(">>> ")
        raw = getattr(sys.stdin, "buffer", None)
        if raw is None:  # a text stream without bytes underneath (tests, embedding)
            line = sys.stdin.readline()
            return None if line == "" else line.rstrip("\n")
        data = raw.readline()
        if data == b"":
            return None
        try:
            return data.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise BadLine(f"the line is not valid UTF-8 (byte {exc.start}); skipped") from None
    except UnicodeDecodeError:
        raise BadLine("the line is not valid UTF-8; skipped") from None
    except EOFError:
        return None


class ReasoningView:
    """Shows a reasoning model's thinking apart from its answer: the text between <think> and </think> (or from the
    start, where the chat template opened the block) dimmed on a terminal, between [thinking] and [answer] lines
    otherwise; the markers themselves are not shown. Holds back text that may be the start of a marker."""

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self, inside: bool, terminal: bool):
        self.inside, self.terminal = inside, terminal
        self.pending = ""
        self.started = False  # whether the reasoning's opening was shown

    def _enter(self) -> str:
        self.started = True
        return "\x1b[2m" if self.terminal else "[thinking]\n"

    def _leave(self) -> str:
        return "\x1b[0m\n" if self.terminal else "\n[answer]\n"

    def feed(self, chunk: str) -> str:
        self.pending += chunk
        out = []
        while True:
            marker = self.CLOSE if self.inside else self.OPEN
            cut = self.pending.find(marker)
            if cut < 0:
                break
            text, self.pending = self.pending[:cut], self.pending[cut + len(marker):]
            if self.inside:
                out += [self._enter() if not self.started else "", text, self._leave()]
                self.inside = False
            else:
                out += [text, self._enter()]
                self.inside = True
        keep = max((k for k in range(1, min(len(self.CLOSE), len(self.pending) + 1)) if self.CLOSE.startswith(self.pending[-k:]) or
                    self.OPEN.startswith(self.pending[-k:])), default=0)
        text, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
        if text and self.inside and not self.started:
            out.append(self._enter())
        out.append(text)
        return "".join(out)

    def finish(self) -> str:
        text, self.pending = self.pending, ""
        if self.inside and (self.started or text):
            return (self._enter() if not self.started else "") + text + ("\x1b[0m" if self.terminal else "")
        return text


class HarmonyView:
    """A harmony answer (gpt-oss) shown as ReasoningView shows one: the analysis channel dimmed on a terminal (between
    [thinking] and [answer] lines otherwise), the final and commentary channels as the answer, a tool call's
    arguments after a [call RECIPIENT] line; the format's markers are not shown."""

    def __init__(self, parser, terminal: bool):
        self.parser, self.terminal = parser, terminal
        self.mode = None  # what the last piece shown was: "reasoning", "answer" or a tool call's recipient

    def _show(self, pieces) -> str:
        out = []
        for piece in pieces:
            mode = "reasoning" if piece.reasoning else (piece.recipient or "answer")
            if mode != self.mode:
                if self.mode == "reasoning":
                    out.append("\x1b[0m\n" if self.terminal else "\n")
                elif self.mode is not None:
                    out.append("\n")
                if mode == "reasoning":
                    out.append("\x1b[2m" if self.terminal else "[thinking]\n")
                elif mode == "answer":
                    out.append("" if self.terminal else "[answer]\n")
                else:
                    out.append(f"[call {mode}]\n")
                self.mode = mode
            out.append(piece.text)
        return "".join(out)

    def feed(self, chunk: str) -> str:
        return self._show(self.parser.feed(chunk))

    def finish(self) -> str:
        text = self._show(self.parser.finish())
        return text + ("\x1b[0m" if self.terminal and self.mode == "reasoning" else "")


def _status(result) -> str:
    s = result.stats
    line = f"[{s.new_tokens} tokens, {s.tokens_per_second:.1f} tok/s, prefill {s.prefill_seconds * 1000:.0f} ms"
    if s.drafter != "none":
        line += f", {s.drafter}: {s.mean_accepted:.2f} tokens/call"
        if s.acceptance_by_position:
            line += ", accepted by depth " + "/".join(f"{a:.0%}" for a in s.acceptance_by_position)
    return line + "]"


def _stats(result) -> str:
    if result is None:
        return "no answer yet"
    s = result.stats
    return (f"new tokens {s.new_tokens}, prompt tokens {s.prompt_tokens} ({s.reused_tokens} reused from the cache), "
            f"target calls {s.target_calls}, tokens/call {s.mean_accepted:.2f}, {s.tokens_per_second:.1f} tok/s, "
            f"drafter {s.drafter}, finish {result.finish_reason}")


def _json_format(arg: str) -> dict:
    """/json's argument: nothing (any JSON object) or a schema file (SpecrtError naming what is wrong with it)."""
    import json

    from specrt.runtime.constraint import OutputConstraint

    if not arg:
        return {"type": "json_object"}
    try:
        schema = json.loads(Path(arg).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecrtError(f"{arg}: not a readable JSON schema ({type(exc).__name__}: {str(exc)[:120]})") from None
    fmt = {"type": "json_schema", "json_schema": {"name": Path(arg).stem, "schema": schema}}
    OutputConstraint.grammar_for(fmt)  # compiles, or names the problem
    return fmt


def _calls(result) -> str:
    """The answer's tool calls, one line each (the chat cannot run them: an app would, and send the result)."""
    return "".join(f"[tool call] {c['function']['name']}({c['function']['arguments']})\n"
                   for c in (result.tool_calls or ()))


def run_chat(engine, params, system: str | None = None, out=sys.stdout, response_format: dict | None = None,
             tools: list | None = None, tool_choice: str = "auto") -> None:
    interactive = sys.stdin.isatty()
    if interactive:  # Ctrl-C stops an answer even when started from a job that ignores SIGINT (a background &)
        import signal

        signal.signal(signal.SIGINT, signal.default_int_handler)
    session = engine.chat(system)
    name = engine.manifest.model_name
    print(f"specrt chat: {name} ({engine.manifest.target.precision}, {', '.join(engine.providers[:1])}). {HELP}",
          file=out, flush=True)
    while True:
        try:
            line = _read_line(interactive)
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh prompt (Ctrl-D or /exit leaves)
            print("\n(/exit or Ctrl-D to leave)", file=out, flush=True)
            continue
        except BadLine as exc:
            print(f"error: {exc}", file=out, flush=True)
            continue
        if line is None or line.strip() == "/exit":
            break
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            session.reset()
            print("(conversation cleared)", file=out, flush=True)
            continue
        if text == "/stats":
            print(_stats(session.last), file=out, flush=True)
            continue
        if text == "/text":
            response_format = None
            print("(plain answers)", file=out, flush=True)
            continue
        if text == "/json" or text.startswith("/json "):
            try:
                response_format = _json_format(text[5:].strip())
            except SpecrtError as exc:
                print(f"error: {exc}", file=out, flush=True)
                continue
            print("(answers as JSON" + (", fitting the schema)" if text[5:].strip() else ")"), file=out, flush=True)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]}; {HELP}", file=out, flush=True)
            continue
        gen = None
        try:
            messages = session.messages + [{"role": "user", "content": text}]
            harmony = engine.harmony_parser(messages)
            view = (HarmonyView(harmony, interactive) if harmony is not None
                    else ReasoningView(engine.reasoning_open(messages), interactive))
            gen = session.send(text, params, response_format=response_format, tools=tools, tool_choice=tool_choice)
            if tools:  # the answer is read once it ends: its text, then its calls
                gen.wait()
                out.write(gen.result.text + ("\n" if gen.result.text and gen.result.tool_calls else "")
                          + _calls(gen.result).rstrip("\n"))
            else:
                for chunk in gen:
                    out.write(view.feed(chunk))
                    out.flush()
                out.write(view.finish())
        except KeyboardInterrupt:
            if gen is not None:
                gen.close()
            print("\n(stopped)", file=out, flush=True)
            continue
        except SpecrtError as exc:  # a line over the context, a template that refuses it: that line only
            if gen is not None:
                gen.close()
            print(f"error: {exc}", file=out, flush=True)
            continue
        print(file=out)
        if gen.result is not None:
            print(_status(gen.result), file=out, flush=True)
