"""The bundle's tokenizer (tokenizers' tokenizer.json) and chat template (jinja2, sandboxed).

Templates are rendered the way transformers' apply_chat_template does: an immutable sandbox,
`raise_exception`, `bos_token` / `eos_token` from tokenizer_config.json, `add_generation_prompt`. A bundle is a
file people share, so its template is bounded too: `range` hands out at most RENDER_ITEMS items per render,
string and list repetition and powers are capped, and the output stops at RENDER_CHARS characters (plus twice
the messages' own) or RENDER_SECONDS seconds (a TemplateError, not a hang or a memory blow-up).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from specrt.errors import BundleError, SpecrtError


class PromptError(SpecrtError):
    """An empty prompt or malformed chat messages."""


class TemplateError(SpecrtError):
    """The chat template could not render the messages."""


RENDER_ITEMS = 1_000_000  # range() items one render may ask for, all loops together
RENDER_CHARS = 1 << 22  # characters one render may produce
RENDER_SECONDS = 5.0


def _raise(message):
    raise TemplateError(f"chat template: {message}")


def _bounded_environment():
    """jinja2's immutable sandbox with repetition and powers capped and a per-render range() budget."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise TemplateError("chat template: a power above 64")
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and len(seq) * count > RENDER_CHARS:
                        raise TemplateError(f"chat template: a repetition longer than {RENDER_CHARS} items")
            return super().call_binop(context, operator, left, right)

    env = Bounded(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env


class BundleTokenizer:
    def __init__(self, bundle: Path, chat_template: str | None):
        from tokenizers import Tokenizer

        path = Path(bundle) / "tokenizer.json"
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise BundleError(f"{path}: unreadable tokenizer ({exc})") from None
        cfg_path = Path(bundle) / "tokenizer_config.json"
        try:
            cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        except (OSError, ValueError, RecursionError) as exc:
            raise BundleError(f"{cfg_path}: unreadable ({type(exc).__name__}: {str(exc)[:120]})") from None
        if not isinstance(cfg, dict):
            raise BundleError(f"{cfg_path}: must be a JSON object, not {type(cfg).__name__}")
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.template, self.template_source = None, chat_template  # the template, compiled and as written
        if chat_template:
            self._items = 0  # range() items handed out in the render under way
            env = _bounded_environment()
            env.globals["range"] = self._range
            try:
                self.template = env.from_string(chat_template)
            except Exception as exc:  # TemplateSyntaxError, RecursionError on deep nesting...
                raise BundleError(f"the bundle's chat template does not compile ({type(exc).__name__}: "
                                  f"{str(exc)[:160]})") from None

    def _range(self, *args):
        items = range(*args)
        self._items += len(items)
        if self._items > RENDER_ITEMS:
            raise TemplateError(f"chat template: its loops ask for more than {RENDER_ITEMS} items")
        return items

    @property
    def harmony(self) -> bool:
        """The vocabulary has gpt-oss's harmony markers (runtime/harmony.py): answers are decoded with them kept, so
        that their channels (reasoning, answer, tool calls) can be told apart."""
        if not hasattr(self, "_harmony"):
            from specrt.runtime.harmony import VOCAB_MARKERS

            vocab = self.tok.get_vocab(with_added_tokens=True)
            self._harmony = all(m in vocab for m in VOCAB_MARKERS)
        return self._harmony

    @property
    def max_token_chars(self) -> int:
        """Characters of the longest vocabulary entry: no token covers more of a text (byte-level and
        sentencepiece entries spell at least the characters they stand for)."""
        if not hasattr(self, "_max_token_chars"):
            self._max_token_chars = max((len(t) for t in self.tok.get_vocab()), default=1)
        return self._max_token_chars

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, variables: dict | None = None) -> str:
        """The conversation through the chat template; `variables` are further template variables (Qwen3 and
        Qwen3.5's enable_thinking)."""
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list of {'role', 'content'} dicts")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PromptError("each message needs a string 'role' and a string 'content'")
        if self.template is None:  # base models: plain concatenation
            return "\n".join(m["content"] for m in messages)
        self._items, out, size, t0 = 0, [], 0, time.perf_counter()
        limit = RENDER_CHARS + 2 * sum(len(m["content"]) for m in messages)  # the messages, plus room to wrap them
        try:
            for chunk in self.template.generate(**(variables or {}), messages=messages,
                                                add_generation_prompt=add_generation_prompt,
                                                bos_token=self.bos_token or "", eos_token=self.eos_token or ""):
                out.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise TemplateError(f"chat template: its output passed {limit} characters")
                if time.perf_counter() - t0 > RENDER_SECONDS:
                    raise TemplateError(f"chat template: rendering took over {RENDER_SECONDS:.0f} s")
            return "".join(out)
        except TemplateError:
            raise
        except Exception as exc:
            raise TemplateError(f"chat template failed: {exc}") from None


def _token_text(token) -> str | None:
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None
