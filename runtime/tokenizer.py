"""The bundle's tokenizer (tokenizers' tokenizer.json) and chat template (jinja2, sandboxed).

Templates are rendered the way transformers' apply_chat_template does: an immutable sandbox,
`raise_exception`, `bos_token` / `eos_token` from tokenizer_config.json, `add_generation_prompt`.
"""

from __future__ import annotations

import json
from pathlib import Path

from specrt.errors import BundleError, SpecrtError


class PromptError(SpecrtError):
    """An empty prompt or malformed chat messages."""


class TemplateError(SpecrtError):
    """The chat template could not render the messages."""


def _raise(message):
    raise TemplateError(f"chat template: {message}")


class BundleTokenizer:
    def __init__(self, bundle: Path, chat_template: str | None):
        from tokenizers import Tokenizer

        path = Path(bundle) / "tokenizer.json"
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise BundleError(f"{path}: unreadable tokenizer ({exc})") from None
        cfg_path = Path(bundle) / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.template = None
        if chat_template:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self.template = env.from_string(chat_template)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list of {'role', 'content'} dicts")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PromptError("each message needs a string 'role' and a string 'content'")
        if self.template is None:  # base models: plain concatenation
            return "\n".join(m["content"] for m in messages)
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError:
            raise
        except Exception as exc:
            raise TemplateError(f"chat template failed: {exc}") from None


def _token_text(token) -> str | None:
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None
