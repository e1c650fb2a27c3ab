"""OpenAI request bodies -> what the engine runs, with OpenAI-style errors for anything else.

Accepted: model, messages (chat) or prompt (completions), max_tokens / max_completion_tokens, temperature,
top_p, seed, stop (a string or up to 4), stream, stream_options.include_usage, n = 1, `ignore_eos` (vLLM's
extension: generate max_tokens even past the end-of-text token), `chat_template_kwargs` {"enable_thinking": bool}
(vLLM's: a reasoning model's thinking on or off), `reasoning_effort` low | medium | high (gpt-oss's chat
template; OpenAI's name), `response_format` json_object | json_schema (the output constrained to it, with the
grammar extra installed: runtime/constraint.py), `tools` / `tool_choice` none | auto | required | a named function /
`parallel_tool_calls` (runtime/tools.py; chat only; the history may hold assistant `tool_calls` and `tool`
messages, and an assistant's `reasoning_content`, handed to the template as it takes an earlier thought),
`reasoning_format` (llama-server's: `auto` / `deepseek`, the default: a reasoning model's thought comes apart as
`reasoning_content`; `none`: it stays in the content, markers and all), and the parameters that
change nothing here at their neutral values (presence/frequency penalty 0, logprobs false, user). Anything
else that would change the output is refused (400), not silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specrt.errors import SpecrtError
from specrt.runtime.harmony import REASONING_EFFORTS
from specrt.runtime.sampling import SamplingParams

MAX_BODY_BYTES = 8 << 20  # a request body larger than this is refused (413) before it is parsed
MAX_DEPTH = 64  # JSON nesting
MAX_INT_DIGITS = 24  # an integer literal longer than this is refused (no real parameter needs one)
MAX_MESSAGES = 4096
REASONING_FORMATS = ("auto", "deepseek", "none")  # llama-server's names: the first two split the thought out

NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "logprobs": False, "n": 1, "echo": False}
IGNORED = {"user", "metadata", "store", "service_tier", "stream_options"}
KNOWN = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
         "stop", "stream", "ignore_eos", "chat_template_kwargs", "reasoning_effort", "response_format", "tools",
         "tool_choice", "parallel_tool_calls", "reasoning_format", *NEUTRAL,
         *IGNORED}


class RequestError(Exception):
    """An OpenAI-style error: HTTP status, message, the parameter at fault and a code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Job:
    prompt: object  # a message list (chat) or a string (completions, fed raw)
    raw: bool
    params: SamplingParams
    stream: bool
    include_usage: bool
    ids: list[int] | None = None  # the prompt's token ids, once the server has checked its length
    thinking: bool | None = None  # chat_template_kwargs.enable_thinking (None: the template's default)
    reasoning_effort: str | None = None  # gpt-oss: "low" | "medium" | "high" (None: the template's default)
    response_format: dict | None = None  # json_object / json_schema (None: text)
    tools: list | None = None  # OpenAI's tools (checked), with tool_choice and parallel_tool_calls
    tool_choice: object = None
    parallel_tool_calls: bool = True
    reasoning_inline: bool = False  # reasoning_format none: the thought stays in the content


def _depth(value, limit: int) -> int:
    """Deepest nesting of lists and objects in a parsed JSON value, counted without recursion and given up past
    `limit` (returns limit + 1 then): linear in the value's size, on a value json.loads has already built."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return depth
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _bounded_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise RequestError(400, f"an integer of {len(literal)} digits in the request", None, "invalid_value")
    return int(literal)


def load_body(raw: bytes) -> object:
    """The request body as JSON, within the server's limits (RequestError 400 otherwise)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"the request body is not UTF-8 ({exc.reason} at byte {exc.start})", None,
                           "invalid_json") from None
    # parsed first, by the standard library's linear parser (no regular expression runs over the raw body:
    # backtracking over an unterminated string once took seconds a kilobyte, on the event loop), checked after
    try:
        body = json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise RequestError(400, f"the request body nests deeper than {MAX_DEPTH} levels", None,
                           "invalid_json") from None
    except ValueError as exc:
        raise RequestError(400, f"the request body is not valid JSON ({str(exc)[:200]})", None, "invalid_json") from None
    if _depth(body, MAX_DEPTH) > MAX_DEPTH:
        raise RequestError(400, f"the request body nests deeper than {MAX_DEPTH} levels", None, "invalid_json")
    return body


def _text(value: str, param: str) -> str:
    """A string that can be encoded (a lone surrogate such as "\\ud800" cannot)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(400, f"'{param}' is not valid Unicode (a lone surrogate)", param, "invalid_value") from None
    return value


def _number(body: dict, name: str, default, lo: float, hi: float, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise RequestError(400, f"'{name}' must be {'an integer' if integer else 'a number'}, got {value!r}", name,
                           "invalid_type")
    if not lo <= value <= hi:
        raise RequestError(400, f"'{name}' must be between {lo} and {hi}, got {value}", name, "invalid_value")
    return value


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise RequestError(400, "'stop' must be a non-empty string or a list of up to 4", "stop", "invalid_value")
    return tuple(_text(s, "stop") for s in stop)


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list", "messages", "invalid_type")
    if len(messages) > MAX_MESSAGES:
        raise RequestError(400, f"{len(messages)} messages; at most {MAX_MESSAGES} are taken", "messages",
                           "invalid_value")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(400, f"messages[{i}] needs a role of system, user, assistant or tool",
                               f"messages[{i}].role", "invalid_value")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(400, f"messages[{i}].content: only text parts are supported",
                                   f"messages[{i}].content", "unsupported_value")
            content = "".join(p["text"] for p in content)
        calls = m.get("tool_calls") if m["role"] == "assistant" else None
        if content is None and calls:
            content = ""
        if not isinstance(content, str):
            raise RequestError(400, f"messages[{i}].content must be a string", f"messages[{i}].content", "invalid_type")
        message = {"role": "system" if m["role"] == "developer" else m["role"],
                   "content": _text(content, f"messages[{i}].content")}
        if calls:
            message["tool_calls"] = _history_calls(calls, i)
        thought = m.get("reasoning_content") if m["role"] == "assistant" else None
        if thought is not None:  # an earlier turn's thought, sent back as llama.cpp and vLLM give it out
            if not isinstance(thought, str):
                raise RequestError(400, f"messages[{i}].reasoning_content must be a string",
                                   f"messages[{i}].reasoning_content", "invalid_type")
            message["reasoning_content"] = _text(thought, f"messages[{i}].reasoning_content")
        if m["role"] == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise RequestError(400, f"messages[{i}] (a tool result) needs a string tool_call_id",
                                   f"messages[{i}].tool_call_id", "invalid_type")
            message["tool_call_id"] = call_id
        out.append(message)
    return out


def _history_calls(calls, i: int) -> list[dict]:
    """An assistant message's earlier tool calls: [{"id", "type": "function", "function": {"name", "arguments"}}]."""
    ok = isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments"), str) for c in calls)
    if not ok:
        raise RequestError(400, f"messages[{i}].tool_calls must be a list of {{\"id\", \"type\": \"function\", "
                           "\"function\": {\"name\": string, \"arguments\": string}}", f"messages[{i}].tool_calls",
                           "invalid_value")
    return [{"id": c.get("id"), "type": "function", "function": {"name": c["function"]["name"],
                                                                 "arguments": c["function"]["arguments"]}}
            for c in calls]


def parse(body, chat: bool, model_id: str, max_context: int) -> Job:
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object", None, "invalid_json")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise RequestError(400, f"unsupported parameter '{unknown[0]}'", unknown[0], "unsupported_parameter")
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] not in (None, neutral):
            raise RequestError(400, f"'{name}' = {body[name]!r} is not supported by specrt", name, "unsupported_value")
    model = body.get("model")
    if model is not None and model != model_id:
        raise RequestError(404, f"the model '{model}' does not exist (this server runs '{model_id}')", "model",
                           "model_not_found")
    if chat:
        prompt, raw = _messages(body), False
    else:
        prompt, raw = body.get("prompt"), True
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, "'prompt' must be a non-empty string", "prompt", "invalid_type")
        _text(prompt, "prompt")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _number({"max_tokens": limit}, "max_tokens", max_context, 1, 1 << 30, integer=True)
    try:
        params = SamplingParams(
            max_new_tokens=max_tokens,
            temperature=float(_number(body, "temperature", 1.0, 0.0, 2.0)),
            top_p=float(_number(body, "top_p", 1.0, 1e-9, 1.0)),
            seed=_number(body, "seed", None, 0, (1 << 63) - 1, integer=True),
            stop=_stops(body),
            stop_token_ids=() if body.get("ignore_eos") is True else None,
        )
    except SpecrtError as exc:  # what SamplingParams itself refuses
        raise RequestError(400, str(exc), None, "invalid_value") from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean", "stream", "invalid_type")
    options = body.get("stream_options") or {}
    include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise RequestError(400, f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}",
                           "reasoning_effort", "invalid_value")
    shape = body.get("reasoning_format", "auto")
    if shape not in REASONING_FORMATS:
        raise RequestError(400, f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)}",
                           "reasoning_format", "invalid_value")
    job = Job(prompt, raw, params, stream, include_usage, thinking=_thinking(body), reasoning_effort=effort,
              response_format=_response_format(body), reasoning_inline=shape == "none")
    _tools(body, job, chat)
    if body.get("ignore_eos") is True and (job.response_format is not None
                                           or (job.tools is not None and job.tool_choice != "none")):
        # a grammar ends the answer where it is complete; generating on past it could only fail at the end
        raise RequestError(400, "'ignore_eos' cannot be combined with response_format or tools (their grammar "
                           "decides where the answer ends)", "ignore_eos", "invalid_value")
    return job


def _tools(body: dict, job: Job, chat: bool) -> None:
    """tools / tool_choice / parallel_tool_calls onto the job, checked here (a 400 names the problem)."""
    from specrt.runtime.tools import ToolError, parse_choice, parse_tools

    tools, choice, parallel = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError(400, "'parallel_tool_calls' must be a boolean", "parallel_tool_calls", "invalid_type")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise RequestError(400, "'tool_choice' needs 'tools'", "tool_choice", "invalid_value")
        return
    if not chat:
        raise RequestError(400, "'tools' are taken by /v1/chat/completions only", "tools", "unsupported_parameter")
    try:
        parse_choice(choice, parse_tools(tools))
    except ToolError as exc:
        param = "tool_choice" if str(exc).startswith("tool_choice") else "tools"
        raise RequestError(400, str(exc), param, "invalid_value") from None
    job.tools, job.tool_choice, job.parallel_tool_calls = tools, choice, parallel is not False


def _response_format(body: dict) -> dict | None:
    """OpenAI's response_format: text (None), or json_object / json_schema, compiled here so that a schema the
    grammar engine cannot use is a 400 naming it."""
    value = body.get("response_format")
    if value is None or value == {"type": "text"}:
        return None
    from specrt.runtime.constraint import ConstraintError, OutputConstraint

    try:
        OutputConstraint.grammar_for(value)
    except ConstraintError as exc:
        raise RequestError(400, f"response_format: {exc}", "response_format", "invalid_value") from None
    return value


def _thinking(body: dict) -> bool | None:
    """chat_template_kwargs: only enable_thinking (a boolean) is taken; other template variables are refused."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}:
        raise RequestError(400, "'chat_template_kwargs' takes only {\"enable_thinking\": true|false}",
                           "chat_template_kwargs", "unsupported_value")
    value = kwargs.get("enable_thinking")
    if value is not None and not isinstance(value, bool):
        raise RequestError(400, "'chat_template_kwargs.enable_thinking' must be a boolean",
                           "chat_template_kwargs.enable_thinking", "invalid_type")
    return value
