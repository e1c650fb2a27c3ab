"""`specrt serve` request parsing: what reaches the engine, and the OpenAI-style errors for everything else."""

from __future__ import annotations

import pytest

from specrt.app.serve.requests import RequestError, parse

ASK = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "x": {"type": "integer"}}, "required": ["x"]}}}


def test_tools_and_a_tool_history_reach_the_job():
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "2"}]
    job = parse({"messages": history, "tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
                True, "m", 4096)
    assert job.tools == [TOOL] and job.tool_choice == "required" and job.parallel_tool_calls is False
    assert job.prompt[1] == {"role": "assistant", "content": "", "tool_calls": history[1]["tool_calls"]}
    assert job.prompt[2] == {"role": "tool", "content": "2", "tool_call_id": "call_1"}
    with pytest.raises(RequestError, match="chat/completions only"):
        parse({"prompt": "x", "tools": [TOOL]}, False, "m", 4096)


def test_a_chat_request_becomes_sampling_parameters():
    job = parse({"model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                            {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                 "max_tokens": 12, "temperature": 0, "top_p": 0.5, "seed": 3, "stop": "x", "stream": True,
                 "stream_options": {"include_usage": True}, "presence_penalty": 0, "n": 1}, True, "m", 4096)
    assert job.prompt == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    p = job.params
    assert (p.max_new_tokens, p.temperature, p.top_p, p.seed, p.stop) == (12, 0.0, 0.5, 3, ("x",))
    assert job.stream and job.include_usage and not job.raw and p.stop_token_ids is None
    defaults = parse({"messages": ASK}, True, "m", 4096).params  # OpenAI's defaults; as long as the context
    assert (defaults.temperature, defaults.top_p, defaults.max_new_tokens) == (1.0, 1.0, 4096)
    completion = parse({"prompt": ["once upon"], "max_completion_tokens": 5, "ignore_eos": True}, False, "m", 64)
    assert completion.raw and completion.prompt == "once upon" and completion.params.max_new_tokens == 5
    assert completion.params.stop_token_ids == ()


@pytest.mark.parametrize("body, status, code", [
    ([1, 2], 400, "invalid_json"),
    ({"messages": []}, 400, "invalid_type"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_value"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "unsupported_value"),
    ({"messages": ASK, "max_tokens": 0}, 400, "invalid_value"),
    ({"messages": ASK, "max_tokens": 2.5}, 400, "invalid_type"),
    ({"messages": ASK, "temperature": "hot"}, 400, "invalid_type"),
    ({"messages": ASK, "top_p": 0}, 400, "invalid_value"),
    ({"messages": ASK, "stop": ["a", "b", "c", "d", "e"]}, 400, "invalid_value"),
    ({"messages": ASK, "stream": "yes"}, 400, "invalid_type"),
    ({"messages": ASK, "logprobs": True}, 400, "unsupported_value"),
    ({"messages": ASK, "functions": []}, 400, "unsupported_parameter"),
    ({"messages": ASK, "response_format": {"type": "xml"}}, 400, "invalid_value"),
    ({"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
     400, "invalid_value"),
    ({"model": "other", "messages": ASK}, 404, "model_not_found"),
    ({"messages": ASK, "tools": [{"type": "function", "function": {"name": "a b"}}]}, 400, "invalid_value"),
    ({"messages": ASK, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400,
     "invalid_value"),
    ({"messages": ASK, "tool_choice": "required"}, 400, "invalid_value"),
    ({"messages": ASK, "tools": [TOOL], "parallel_tool_calls": "yes"}, 400, "invalid_type"),
    ({"messages": [{"role": "tool", "content": "18 C"}]}, 400, "invalid_type"),  # no tool_call_id
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}]}, 400,
     "invalid_value"),
])
def test_bad_requests_are_named(body, status, code):
    with pytest.raises(RequestError) as info:
        parse(body, True, "m", 4096)
    err = info.value
    assert (err.status, err.code) == (status, code)
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}


def _scan_depth(text: str) -> int:
    """The plain character scan of a JSON text that the server's depth of the parsed body must agree with."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def test_body_depth_counts_nesting_of_the_parsed_body():
    import json
    import random

    from specrt.app.serve.requests import MAX_DEPTH, _depth, load_body

    rng = random.Random(0)
    pieces = ["[", "{", "]", "}", '\\"', "\\\\", "a", " ", ":", ","]

    def value(level):
        if level > 6 or rng.random() < 0.3:
            return "".join(rng.choice(pieces) for _ in range(rng.randrange(8)))  # a string with brackets in it
        if rng.random() < 0.5:
            return [value(level + 1) for _ in range(rng.randrange(3))]
        return {str(i): value(level + 1) for i in range(rng.randrange(3))}

    for _ in range(300):
        v = value(0)
        text = json.dumps(v)
        assert _depth(v, 100) == _scan_depth(text), text
    deep = '{"messages": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}"
    with pytest.raises(RequestError, match="nests deeper"):
        load_body(deep.encode())
    with pytest.raises(RequestError, match="nests deeper"):  # past the parser's own recursion limit
        load_body(b"[" * 200_000 + b"]" * 200_000)
    quoted = '{"messages": "' + "[" * 10_000 + '"}'  # brackets inside a string are text
    assert load_body(quoted.encode()) == {"messages": "[" * 10_000}


def test_an_unterminated_string_of_escaped_quotes_is_refused_in_linear_time():
    """A string opened and never closed, full of escaped quotes: the regular expression that once looked for
    strings in the raw body backtracked quadratically over it (100 KB blocked the server 21 s). Parsing first, a
    body of 8 MB is refused at once."""
    import time

    from specrt.app.serve.requests import MAX_BODY_BYTES, load_body

    for size in (100_000, MAX_BODY_BYTES - 100):
        body = b'{"messages": "' + b'\\"' * (size // 2)
        t0 = time.perf_counter()
        with pytest.raises(RequestError, match="not valid JSON"):
            load_body(body)
        assert time.perf_counter() - t0 < 1.0


def test_completions_need_a_prompt():
    with pytest.raises(RequestError, match="'prompt' must be a non-empty string"):
        parse({"messages": ASK}, False, "m", 4096)


class _FakeGeneration:
    """One chunk, released by the engine's event; then result "done" (the engine's Generation contract)."""

    def __init__(self, release):
        self.release, self.sent, self.result = release, False, None

    def __iter__(self):
        return self

    def __next__(self):
        if self.sent:
            self.result = "done"
            raise StopIteration
        self.release.wait(5)
        self.sent = True
        return "chunk"

    def close(self):
        pass


class _SlowEngine:
    """Holds every generation until `release` is set, and records the order it ran them in."""

    def __init__(self):
        import threading

        self.release, self.runs = threading.Event(), []

    def generate(self, prompt, params, raw=False, ids=None, response_format=None, **tool_and_template_options):
        self.runs.append(prompt)
        return _FakeGeneration(self.release)


def test_the_queue_is_bounded_and_first_come_first_served():
    import asyncio

    from specrt.app.serve.requests import parse
    from specrt.app.serve.worker import EngineWorker, QueueFull

    engine = _SlowEngine()
    worker = EngineWorker(engine, queue_size=2)

    async def scenario():
        jobs = [parse({"messages": [{"role": "user", "content": str(i)}]}, True, "m", 64) for i in range(3)]
        first, second = worker.submit(jobs[0]), worker.submit(jobs[1])
        with pytest.raises(QueueFull):
            worker.submit(jobs[2])  # two waiting or running: the third is refused (the server answers 503)
        engine.release.set()
        for ticket in (first, second):
            events = [await ticket.events.get(), await ticket.events.get()]
            assert events == [("text", "chunk"), ("done", "done")]
        for _ in range(100):
            if worker.active == 0:
                break
            await asyncio.sleep(0.01)
        assert worker.active == 0
        third = worker.submit(jobs[2])  # room again
        assert await third.events.get() == ("text", "chunk")

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))  # a worker that fails must fail the test, not hang it
    assert [p[0]["content"] for p in engine.runs] == ["0", "1", "2"]  # in arrival order
