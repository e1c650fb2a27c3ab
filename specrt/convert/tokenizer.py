"""Carry the tokenizer and chat template into the bundle, and find the stop token ids.

HF folder: tokenizer.json (+ tokenizer_config.json, chat template) is copied as it is; a folder
with only a sentencepiece tokenizer.model goes through transformers once to get tokenizer.json.
GGUF: transformers' GGUF tokenizer conversion rebuilds tokenizer.json from the file's metadata.
The bundle always holds tokenizer.json (what the runtime loads with the `tokenizers` package).
The chat template is rendered once on sample conversations through the runtime's bounded renderer: one that
goes past its limits (steps, time, size) is refused here, and no bundle is written.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from specrt.errors import SourceError
from specrt.runtime import harmony

# end-of-turn / end-of-text tokens that chat models emit; any present in the vocabulary stops generation
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<eos>", "</s>", "<|end|>")
COPY_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

# what a chat template is tried on at conversion: one turn, a system prompt and a few turns, and tools with a call
_SAMPLE_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
_SAMPLE_TURNS = [{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "Hello!"},
                 {"role": "assistant", "content": "Hello! How can I help?"},
                 {"role": "user", "content": "What is the weather in Paris?"}]
_SAMPLE_CALL = [{"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "name": "get_weather", "content": "{\"celsius\": 21}"}]
SAMPLE_CONVERSATIONS = (
    ([{"role": "user", "content": "Hello!"}], {}),
    (_SAMPLE_TURNS, {}),
    (_SAMPLE_TURNS + _SAMPLE_CALL, {"tools": [_SAMPLE_TOOL]}),
)


@dataclass(frozen=True)
class TokenizerInfo:
    files: tuple[str, ...]
    chat_template: str | None
    stop_token_ids: tuple[int, ...]
    bos_token_id: int | None


def _save_with_transformers(out: Path, **kwargs) -> None:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(**kwargs)
    except Exception as exc:
        raise SourceError(f"could not read the tokenizer ({type(exc).__name__}: {exc})") from None
    tok.save_pretrained(str(out))


def _save_gguf_tokenizer(source: Path, out: Path) -> None:
    """tokenizer.json and tokenizer_config.json from a GGUF's metadata, through transformers' loader; where that
    loader cannot build the file's model config (transformers 5.25 fails on gpt-oss's rope.scaling keys), from
    its GGUF tokenizer builder alone, which reads only the tokenizer.* keys (the same vocabulary, merges,
    pre-tokenizer split and special tokens)."""
    try:
        _save_with_transformers(out, pretrained_model_name_or_path=str(source.parent), gguf_file=source.name)
        return
    except SourceError as first:
        error = first
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

        architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(source))
        backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
        settings = {k: v for k, v in {**tokenizer_config, **extra}.items() if v is not None}
        PreTrainedTokenizerFast(tokenizer_object=backend, **settings).save_pretrained(str(out))
    except Exception as exc:
        raise SourceError(f"{error} (and from its tokenizer keys alone: {type(exc).__name__}: {exc})") from None


def _read_template(out: Path) -> str | None:
    jinja = out / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    cfg = out / "tokenizer_config.json"
    if cfg.is_file():
        template = json.loads(cfg.read_text()).get("chat_template")
        if isinstance(template, str):
            return template
    return None


def _check_template(source: Path, template: str, tcfg: dict) -> None:
    """Refuse a template that goes past the runtime's render limits on a sample conversation (its fault, whatever
    the conversation: every request would fail, or cost the server its time and memory until it does)."""
    from specrt.runtime.template_sandbox import TemplateError, check_template

    try:
        check_template(template, SAMPLE_CONVERSATIONS, tcfg)
    except TemplateError as exc:
        reason = str(exc).removeprefix("chat template: ")
        raise SourceError(f"{source}: its chat template goes past the runtime's limits on a sample conversation: "
                          f"{reason}") from None


def _token_id(vocab: dict, token) -> int | None:
    if isinstance(token, dict):
        token = token.get("content")
    return vocab.get(token) if isinstance(token, str) else None


def write_tokenizer(source: Path, kind: str, out: Path, config_eos: tuple[int, ...], config_bos: int | None) -> TokenizerInfo:
    """kind: "hf" (source is a folder) or "gguf" (source is a file). Writes into out."""
    if kind == "hf":
        if (source / "tokenizer.json").is_file():
            for name in COPY_FILES + ("chat_template.jinja",):
                if (source / name).is_file():
                    shutil.copyfile(source / name, out / name)
        elif (source / "tokenizer.model").is_file():
            _save_with_transformers(out, pretrained_model_name_or_path=str(source))
        else:
            raise SourceError(f"{source}: no tokenizer (tokenizer.json or tokenizer.model)")
    else:
        _save_gguf_tokenizer(source, out)
    if not (out / "tokenizer.json").is_file():
        raise SourceError(f"{source}: tokenizer could not be converted to tokenizer.json")

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    tcfg = json.loads((out / "tokenizer_config.json").read_text()) if (out / "tokenizer_config.json").is_file() else {}
    stops = list(config_eos)
    eos = _token_id(vocab, tcfg.get("eos_token"))
    if eos is not None:
        stops.append(eos)
    speaks_harmony = all(t in vocab for t in harmony.VOCAB_MARKERS)  # gpt-oss: <|end|> ends a message, not the answer
    if speaks_harmony:
        stops = [i for i in stops if i != vocab["<|end|>"]] + [vocab[t] for t in harmony.ANSWER_ENDS if t in vocab]
    stops += [vocab[t] for t in END_TOKENS if t in vocab and not (speaks_harmony and t == "<|end|>")]
    bos = config_bos if config_bos is not None else _token_id(vocab, tcfg.get("bos_token"))

    template = _read_template(out)
    if template is not None:
        _check_template(source, template, tcfg)
        (out / "chat_template.jinja").write_text(template)
    files = tuple(n for n in COPY_FILES + ("chat_template.jinja",) if (out / n).is_file())
    return TokenizerInfo(files, template, tuple(dict.fromkeys(stops)), bos)
