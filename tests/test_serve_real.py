"""`specrt serve` on the real model (the shared int4 catalog bundle, its EAGLE-3 head drafting), driven by the
official `openai` client and raw HTTP: answers, streaming equal to non-streaming at temperature 0, stop strings,
usage, 4xx for bad requests (and the server goes on), concurrency, a client that disconnects mid-stream, the API
key."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.server_process import serve

pytestmark = pytest.mark.real_model

KEY = "test-key-123"
MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Name three colors of the rainbow."}]


@pytest.fixture(scope="module")
def server(int4_bundle):
    yield from _serve(int4_bundle)


def _serve(bundle, *extra: str):
    """The server's URL: the bundle served with the key, exact calls (a temperature-0 answer repeats exactly)."""
    for base, _ in serve(bundle, "--model-id", MODEL, "--queue-size", "8", "--batch-invariant", *extra, key=KEY):
        yield base


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_models_health_and_an_answer_with_usage(server, client):
    import httpx

    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(f"{server}/health", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert health["drafter"] == "eagle3+dflash+ngram+ngram:pool"  # auto: the bundle's drafters and ngram, on by default
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    assert text.strip() and r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 24 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    ext = r.model_extra["specrt"]
    assert ext["drafter"] == "eagle3+dflash+ngram+ngram:pool" and ext["mean_accepted"] >= 1.0


def test_stream_equals_non_stream_at_temperature_0(client):
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True))
    assert streamed == done.choices[0].text and done.usage.completion_tokens <= 8


def test_stop_strings(client):
    full = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0)
    text = full.choices[0].message.content
    words = [w for w in text.split() if len(w) > 3]
    assert words, text
    stop = words[len(words) // 2]
    cut = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (json.dumps({"model": MODEL, "messages": "hi"}).encode(), 400, "invalid_type"),
    (json.dumps({"model": MODEL, "messages": ASK, "max_tokens": "many"}).encode(), 400, "invalid_type"),
    (json.dumps({"model": MODEL, "messages": ASK, "temperature": 7}).encode(), 400, "invalid_value"),
    (json.dumps({"model": "gpt-4o", "messages": ASK}).encode(), 404, "model_not_found"),
    (json.dumps({"model": MODEL, "messages": ASK, "n": 3}).encode(), 400, "unsupported_value"),
    (json.dumps({"model": MODEL, "messages": ASK, "tools": []}).encode(), 400, "invalid_value"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "word " * 5000}]}).encode(), 400,
     "context_length_exceeded"),
    # streamed, over the context: 400 before the stream starts (not an error event inside a 200)
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "word " * 5000}], "stream": True}).encode(),
     400, "context_length_exceeded"),
    (b'{"model": "' + MODEL.encode() + b'", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, "invalid_json"),
    (b'{"model": "' + MODEL.encode() + b'", "messages": [], "seed": ' + b"9" * 5000 + b"}", 400, "invalid_value"),
    (json.dumps({"model": MODEL, "messages": ASK, "seed": -1}).encode(), 400, "invalid_value"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "\ud800"}]}).encode(), 400,
     "invalid_value"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 5000}).encode(), 400,
     "invalid_value"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * (9 << 20)}]}).encode(), 413,
     "request_too_large"),
])
def test_bad_requests_get_4xx_and_the_server_goes_on(server, client, body, status, code):
    import httpx

    r = httpx.post(f"{server}/v1/chat/completions", content=body, timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    assert client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0).choices


def test_unknown_routes_and_methods_answer_in_openai_format(server):
    import httpx

    headers = {"Authorization": f"Bearer {KEY}"}
    for method, path, status in (("GET", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405),
                                 ("DELETE", "/v1/models", 405)):
        r = httpx.request(method, f"{server}{path}", headers=headers, timeout=30)
        assert r.status_code == status and r.headers["content-type"].startswith("application/json"), r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_a_non_streaming_client_leaving_frees_the_engine(server, client):
    """The non-streaming twin of the test below: a client that gives up waiting on 4000 tokens frees the engine."""
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 4000,
            "ignore_eos": True, "temperature": 0.8, "seed": 2}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server}/v1/chat/completions", json=body, timeout=2, headers={"Authorization": f"Bearer {KEY}"})
    t0 = time.time()
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)
    assert r.choices[0].message.content and time.time() - t0 < 15


def test_six_concurrent_requests_complete(client):
    answers, errors = [None] * 6, []

    def ask(i):
        try:
            r = client.chat.completions.create(model=MODEL, max_tokens=16, temperature=0,
                                               messages=[{"role": "user", "content": f"Count to {i + 3}."}])
            answers[i] = r.choices[0].message.content
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and all(a for a in answers)


def test_a_client_leaving_mid_stream_frees_the_engine(server, client):
    """A stream asked for 4000 tokens past the end-of-text token (vLLM's ignore_eos; half a minute here) is
    abandoned after its first chunks; the next request finishes long before the abandoned one would have."""
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 4000,
            "ignore_eos": True, "temperature": 0.8, "seed": 1, "stream": True}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: ") for line in got)
    t0 = time.time()
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)
    assert r.choices[0].message.content and time.time() - t0 < 15


def test_api_key_is_required(server):
    import httpx

    for path in ("/v1/models", "/health"):
        assert httpx.get(f"{server}{path}").status_code == 401
    r = httpx.post(f"{server}/v1/chat/completions", json={"model": MODEL, "messages": ASK},
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_response_format_json_schema_through_the_openai_client(client):
    """response_format json_schema: the answer parses and fits the schema, streamed and whole alike."""
    import jsonschema

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                               "population": {"type": "integer", "minimum": 0,
                                                              "maximum": 100000000}},
              "required": ["city", "population"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
    ask = [{"role": "user", "content": "Name a big city and its population, as JSON."}]
    whole = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=64, temperature=0,
                                           response_format=rf)
    jsonschema.validate(json.loads(whole.choices[0].message.content), schema)
    stream = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=64, temperature=0,
                                            response_format=rf, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole.choices[0].message.content
    r = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=128, temperature=0,
                                       response_format={"type": "json_object"})
    content = r.choices[0].message.content
    assert content.lstrip().startswith("{")  # an object, whole where the budget let it end
    assert r.choices[0].finish_reason == "length" or isinstance(json.loads(content), dict)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}


def test_tool_calls_through_the_openai_client(client):
    """tool_choice required: the official client reads the call, whole and streamed (as OpenAI streams calls:
    id and name, then the arguments), with finish_reason tool_calls; the arguments fit the parameters."""
    import jsonschema

    ask = [{"role": "user", "content": "What is the weather in Rome?"}]
    whole = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=64, temperature=0,
                                           tools=[WEATHER_TOOL], tool_choice="required")
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
    calls, finish = {}, None
    for chunk in client.chat.completions.create(model=MODEL, messages=ask, max_tokens=64, temperature=0,
                                                tools=[WEATHER_TOOL], tool_choice="required", stream=True):
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or ():
            entry = calls.setdefault(delta.index, {"name": "", "arguments": "", "id": None})
            entry["id"] = delta.id or entry["id"]
            entry["name"] += (delta.function.name or "") if delta.function else ""
            entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(calls) == 1
    assert calls[0]["name"] == "get_weather" and calls[0]["arguments"] == call.function.arguments
    # the call and its result go back in the history; the next answer is text or another call
    follow = client.chat.completions.create(model=MODEL, max_tokens=32, temperature=0, tools=[WEATHER_TOOL], messages=[
        *ask, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees and sunny"}])
    assert follow.choices[0].message.content or follow.choices[0].message.tool_calls


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]}, "tools"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "search"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_bad_tools_get_400_naming_the_problem(server, client, body, param):
    import httpx

    r = httpx.post(f"{server}/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body}, timeout=60,
                   headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0).choices


@pytest.fixture(scope="module")
def harmony_client(int4_bundle, tmp_path_factory):
    """The server on a bundle that speaks harmony (its markers special tokens, a gpt-oss-shaped template)."""
    from openai import OpenAI

    from tests.tool_templates import MARKERS, TEMPLATES, bundle_with_markers

    folder, _ = bundle_with_markers(int4_bundle, tmp_path_factory.mktemp("harmony") / "b", MARKERS["harmony"],
                                    TEMPLATES["harmony"])
    for base in _serve(folder, "--drafter", "ngram"):
        yield OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_harmony_tool_calls_whole_and_streamed(harmony_client):
    """gpt-oss's format through the server: a required call read from the commentary message, no marker in the
    content, the reasoning (if any) apart, the same whole and streamed."""
    ask = [{"role": "user", "content": "What is the weather in Rome?"}]
    kwargs = dict(model=MODEL, messages=ask, max_tokens=64, temperature=0, tools=[WEATHER_TOOL],
                  tool_choice="required")
    whole = harmony_client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls" and len(whole.message.tool_calls) == 1
    call = whole.message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    assert not whole.message.content or "<|" not in whole.message.content
    reasoning, args, finish = "", "", None
    for chunk in harmony_client.chat.completions.create(**kwargs, stream=True):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            args += "".join(d.function.arguments or "" for d in delta.tool_calls or () if d.function)
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and args == call.function.arguments
    assert reasoning == (getattr(whole.message, "reasoning_content", None) or "")
