"""The bundle's tokenizer (tokenizers' tokenizer.json) and its chat template, rendered the way transformers'
apply_chat_template does (an immutable sandbox, `raise_exception`, `bos_token` / `eos_token` from
tokenizer_config.json, `add_generation_prompt`) and within the limits of runtime/template_sandbox.py: a bundle's
template is code from whoever made the file.
"""

from __future__ import annotations

import json
from pathlib import Path

from specrt.errors import BundleError, SpecrtError
from specrt.runtime.template_sandbox import TemplateError, compile_template, render_cap, render_template, token_text

__all__ = ["BundleTokenizer", "PromptError", "TemplateError"]  # TemplateError: what a render raises


class PromptError(SpecrtError):
    """An empty prompt or malformed chat messages."""


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
        self.bos_token = token_text(cfg.get("bos_token"))
        self.eos_token = token_text(cfg.get("eos_token"))
        # the template, compiled and as written
        self.template = compile_template(chat_template) if chat_template else None
        self.template_source = chat_template

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
        Qwen3.5's enable_thinking). Safe to call from several threads at once."""
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list of {'role', 'content'} dicts")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PromptError("each message needs a string 'role' and a string 'content'")
        if self.template is None:  # base models: plain concatenation
            return "\n".join(m["content"] for m in messages)
        return render_template(self.template, messages, render_cap(messages), **(variables or {}),
                               add_generation_prompt=add_generation_prompt, bos_token=self.bos_token or "",
                               eos_token=self.eos_token or "")
