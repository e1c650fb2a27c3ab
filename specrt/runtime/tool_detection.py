"""Which of the tool formats (runtime/tool_formats.py) a chat template speaks: the formats whose markers it has are
tried in order, and one is taken only where a call the template renders reads back as that call (round_trips);
a template that merely shares a marker (GLM's `<tool_call>NAME<arg_key>...`) gets the generic format."""

from __future__ import annotations

import functools

from specrt.runtime import reasoning
from specrt.runtime.tool_formats import FORMATS, ToolFormat

_PROBE_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": {"type": "object", "required": ["city"], "properties": {
                                                   "city": {"type": "string"}, "days": {"type": "integer"}}}}}
_PROBE_ASK = [{"role": "user", "content": "Weather in Paris?"}]
_PROBE_CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
    "name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]}
_TURN_ENDS = ("<|eot_id|>", "<|im_end|>", "<turn|>", "<|end|>", "<|call|>", "<|return|>", "<end_of_turn>", "</s>")


def _turn_end(text: str) -> str:
    """text without the end-of-turn markers and whitespace it ends with."""
    while True:
        stripped = text.rstrip()
        end = next((e for e in _TURN_ENDS if stripped.endswith(e)), None)
        if end is None:
            return stripped
        text = stripped[:-len(end)]


def round_trips(fmt: ToolFormat, template: str) -> bool:
    """The template writes an earlier call the way `fmt` reads calls: a conversation with one call, rendered, reads
    back (from what the assistant's turn adds to the prompt) as that call. A template that only shares a marker with
    the format (GLM's `<tool_call>NAME<arg_key>...`) does not, nor one that cannot render the probe."""
    from types import SimpleNamespace

    from specrt.errors import SpecrtError
    from specrt.runtime.template_sandbox import compile_template, render_cap, render_template

    def render(messages, add_generation_prompt):
        return render_template(compiled, messages, render_cap(messages), tools=[_PROBE_TOOL], bos_token="",
                               eos_token="", add_generation_prompt=add_generation_prompt)

    try:
        compiled = compile_template(template)
        prompt = render(fmt.history(_PROBE_ASK, template), True)
        whole = render(fmt.history(_PROBE_ASK + [_PROBE_CALL], template), False)
    except (SpecrtError, ValueError, TypeError, LookupError, AttributeError, RecursionError):
        return False
    at = 0
    while at < min(len(prompt), len(whole)) and prompt[at] == whole[at]:
        at += 1
    if at < len(prompt):  # the turn differs from the prompt's opening of it: back to a line or marker's end
        at = max(prompt.rfind("\n", 0, at), prompt.rfind(">", 0, at)) + 1
    open_thought = reasoning.prompt_leaves_open(reasoning.THINK, prompt[:at])
    tool = SimpleNamespace(**{k: _PROBE_TOOL["function"][k] for k in ("name", "parameters")})  # what readers read
    said = fmt.answer(_turn_end(whole[at:]), [tool], reasoning.style_of(template), open_thought)
    return said.calls == [("get_weather", {"city": "Paris", "days": 2})]


@functools.lru_cache(maxsize=32)
def format_of(template: str | None) -> str:
    """The template's own tool format: the first whose markers it has and whose calls it writes as the format reads
    them (round_trips); "generic" (runtime/tools.py) where none does."""
    if not template or "tools" not in template:
        return "generic"
    return next((f.name for f in FORMATS.values() if f.matches(template) and round_trips(f, template)), "generic")
