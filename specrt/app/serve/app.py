"""The routes of `specrt serve` (OpenAI's HTTP API, the parts a local app uses):

GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions; streaming as server-sent events
(`data: {chunk}` ... `data: [DONE]`). Responses carry `usage` and, as an extension, `specrt` (drafter, mean
accepted tokens per target call, acceptance by draft depth, decode tokens/s). With an API key, every request
without `Authorization: Bearer KEY` gets 401.

Nothing one request sends can stall the others: the body must arrive within body_seconds (408), and
everything done with it before it is queued (JSON parsing, checking the tools, rendering the chat template,
counting the prompt's tokens) runs in worker threads, at most PREPARING at once, never on the event loop that
answers every client (/health included). app/serve/guard.py refuses what a web page could send.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from specrt.app.serve.guard import ServeGuard, authorized as key_matches
from specrt.app.serve.requests import MAX_BODY_BYTES, RequestError, load_body, parse
from specrt.app.serve.worker import EngineWorker, QueueFull
from specrt.convert.memory import release_freed_memory
from specrt.runtime.harmony import Piece
from specrt.runtime.reasoning import FINAL
from specrt.runtime.target_session import ContextOverflowError


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _generation_error(exc: Exception) -> RequestError:
    if isinstance(exc, ContextOverflowError):
        return RequestError(400, str(exc), "messages", "context_length_exceeded")
    from specrt.errors import SpecrtError

    if isinstance(exc, SpecrtError):
        return RequestError(400, str(exc), None, "invalid_value")
    return RequestError(500, f"internal error: {type(exc).__name__}: {exc}", None, None, "server_error")


PREPARING = 4  # requests parsed, checked and rendered at once (each in a worker thread)
# after preparing a body this large, the C heap's freed memory goes back to the system: the worker threads' malloc
# arenas otherwise keep a megabytes-large request's peak for good (a soak with 7 MB tool lists grew 370 -> 1,200 MB)
TRIM_AFTER_BYTES = 1 << 20
BODY_SECONDS = 30.0  # the default time a request body may take to arrive


async def _read_body(request: Request, limit: int = MAX_BODY_BYTES, seconds: float = BODY_SECONDS) -> bytes:
    """The body, refused with 413 past `limit` bytes (by its Content-Length, or while it streams in) and with 408
    when it has not all arrived within `seconds` (a client trickling it in holds nothing for long)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the request body is {declared} bytes; the limit is {limit}", None,
                           "request_too_large")

    async def read() -> bytes:
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise RequestError(413, f"the request body passed {limit} bytes", None, "request_too_large")
            parts.append(part)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(read(), timeout=seconds)
    except asyncio.TimeoutError:
        raise RequestError(408, f"the request body did not arrive within {seconds:g} s", None,
                           "request_timeout") from None


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """404, 405 and the like in OpenAI's error format (not Starlette's plain text)."""
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"error": {"message": f"internal error: {type(exc).__name__}", "type": "server_error",
                                   "param": None, "code": None}}, status_code=500)


def _usage(result) -> dict:
    s = result.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.new_tokens,
            "total_tokens": s.prompt_tokens + s.new_tokens}


def _extension(result) -> dict:
    s = result.stats
    return {"drafter": s.drafter, "mean_accepted": round(s.mean_accepted, 3),
            "acceptance_by_position": [round(a, 3) for a in s.acceptance_by_position],
            "tokens_per_second": round(s.tokens_per_second, 1), "prefill_seconds": round(s.prefill_seconds, 4)}


def build_app(engine, model_id: str, api_key: str | None = None, queue_size: int = 16, bind_host: str = "127.0.0.1",
              allowed_hosts=(), cors_origins=(), body_seconds: float = BODY_SECONDS) -> ServeGuard:
    """The server's ASGI app: the routes behind ServeGuard (Host, Origin, Content-Type; app/serve/guard.py)."""
    worker = EngineWorker(engine, queue_size)
    created = int(time.time())
    preparing = asyncio.Semaphore(PREPARING)

    def authorized(request: Request) -> bool:
        return key_matches(request.headers.get("authorization"), api_key)

    def unauthorized() -> JSONResponse:
        return _error(RequestError(401, "missing or wrong API key (send Authorization: Bearer KEY)", None,
                                   "invalid_api_key", "authentication_error"))

    async def health(request: Request):
        if not authorized(request):
            return unauthorized()
        drafter = getattr(engine.drafter, "name", None) if engine.drafter is not None else None
        return JSONResponse({"status": "ok", "model": model_id, "drafter": drafter or "none",
                             "queued_or_running": worker.active})

    async def models(request: Request):
        if not authorized(request):
            return unauthorized()
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": created, "owned_by": "specrt"}]})

    async def complete(request: Request, chat: bool):
        if not authorized(request):
            return unauthorized()
        try:
            raw = await _read_body(request, seconds=body_seconds)
            async with preparing:  # off the event loop: a heavy request stalls no other client
                try:
                    job, thought = await run_in_threadpool(prepare, raw, chat)
                finally:
                    if len(raw) > TRIM_AFTER_BYTES:
                        release_freed_memory()
            ticket = worker.submit(job)
        except RequestError as exc:
            return _error(exc)
        except QueueFull as exc:
            return _error(RequestError(503, f"the server is busy: {exc}", None, "queue_full", "server_error"))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        kind = "chat.completion" if chat else "text_completion"
        calls = job.tools is not None and job.tool_choice != "none"  # the answer is read after it ends
        if job.stream:
            return StreamingResponse(_stream(ticket, rid, kind, chat, job.include_usage, thought, calls,
                                             _content_stream(job)), media_type="text/event-stream")
        parts, checked = [], time.monotonic()
        try:
            while True:
                try:
                    event, value = await asyncio.wait_for(ticket.events.get(), timeout=0.25)
                except asyncio.TimeoutError:
                    event = None
                if time.monotonic() - checked > 0.25:  # text arrives without pause: look at the clock, not gaps
                    checked = time.monotonic()
                    if await request.is_disconnected():  # the client left: stop its generation now
                        ticket.cancel()
                        return JSONResponse({}, status_code=499)
                if event is None:
                    continue
                if event == "text":
                    parts.append(value)
                elif event == "error":
                    return _error(_generation_error(value))
                else:
                    break
        finally:
            ticket.cancel()  # a client that went away while waiting frees its place
        text = "".join(parts)
        message = {"role": "assistant", "content": text}
        if calls:  # the content, thought and calls the engine read from the output
            message = {"role": "assistant", "content": value.text or None,
                       **({"tool_calls": value.tool_calls} if value.tool_calls else {})}
            if value.reasoning:
                message["reasoning_content"] = value.reasoning
        elif thought is not None:  # a reasoning model's thought apart from its answer
            pieces = thought.feed(text) + thought.finish()
            message = {"role": "assistant", "content": "".join(p.text for p in pieces if p.content),
                       "reasoning_content": "".join(p.text for p in pieces if p.reasoning)}
        choice = ({"index": 0, "message": message, "finish_reason": value.finish_reason}
                  if chat else {"index": 0, "text": text, "finish_reason": value.finish_reason, "logprobs": None})
        return JSONResponse({"id": rid, "object": kind, "created": int(time.time()), "model": model_id,
                             "choices": [choice], "usage": _usage(value), "specrt": _extension(value)})

    def prepare(raw: bytes, chat: bool):
        """(the Job, the parser of its answer's thought or None) from a request body: parsed, checked, its prompt
        rendered and counted (in a worker thread)."""
        job = parse(load_body(raw), chat, model_id, engine.max_context)
        _check_prompt(job)  # over the context or refused by the template: 400 before anything streams
        from specrt.errors import SpecrtError

        try:  # a thought (gpt-oss's analysis channel, <think>, Gemma's channel) goes out as reasoning_content
            thought = (engine.answer_parser(job.prompt, job.thinking, job.reasoning_effort, job.reasoning_inline)
                       if chat and not job.raw else None)
        except SpecrtError as exc:
            raise _generation_error(exc) from None
        return job, thought

    def _content_stream(job):
        """A stream whose content may go out as it comes: tool_choice auto under a format whose calls open with a
        marker (free text that may open a call); None for others (a constrained call or JSON answer is read once it
        ends)."""
        from specrt.runtime.tools import streamed_content, template_format

        if job.tools is None or job.tool_choice not in (None, "auto"):
            return None
        return streamed_content(template_format(engine.tokenizer.template_source))

    def _check_prompt(job) -> None:
        from specrt.errors import SpecrtError

        try:
            if job.tools is not None:  # the prompt as the tools render it
                ids = engine.tool_prompt_ids(job.prompt, job.tools, job.tool_choice, job.parallel_tool_calls,
                                             thinking=job.thinking, reasoning_effort=job.reasoning_effort)
            else:
                ids = engine.prompt_ids(job.prompt, raw=job.raw, thinking=job.thinking,
                                        reasoning_effort=job.reasoning_effort)
        except SpecrtError as exc:
            raise _generation_error(exc) from None
        if len(ids) >= engine.max_context:
            raise RequestError(400, f"the prompt has {len(ids)} tokens; this model's context is {engine.max_context}",
                               "messages" if not job.raw else "prompt", "context_length_exceeded")
        job.ids = ids  # the worker generates from these: the template is rendered and the text encoded once

    async def _stream(ticket, rid: str, kind: str, chat: bool, include_usage: bool, thought=None, calls=False,
                      content=None):
        """thought: the answer's parser (its reasoning pieces stream as reasoning_content); calls: the answer is read
        for tool calls once it ends (its content goes out then, unless `content`, a CallContent, lets it out as it
        comes, up to where a call begins)."""
        def chunk(choice: dict | None, **extra) -> str:
            body = {"id": rid, "object": kind + ".chunk" if chat else kind, "created": int(time.time()),
                    "model": model_id, "choices": [choice] if choice is not None else [], **extra}
            return f"data: {json.dumps(body)}\n\n"

        def piece(text: str | None, finish=None) -> dict:
            if chat:
                delta = {} if text is None else {"content": text}
                return {"index": 0, "delta": delta, "finish_reason": finish}
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}

        def out(pieces):
            """Chunks for parsed pieces: the thought as reasoning_content, the answer's text as content (through
            `content` where calls may follow; held for the end where the answer is read for calls)."""
            for p in pieces:
                if p.reasoning:
                    yield chunk({"index": 0, "delta": {"reasoning_content": p.text}, "finish_reason": None})
                elif not p.content:  # a message to a tool (gpt-oss): read as a call, or neither
                    continue
                elif content is not None:
                    if text := content.feed(p.text):
                        yield chunk(piece(text))
                elif not calls:
                    yield chunk(piece(p.text))

        try:
            if chat:
                yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
            while True:
                event, value = await ticket.events.get()
                if event == "text":
                    for line in out(thought.feed(value) if thought is not None else [Piece(FINAL, value)]):
                        yield line
                elif event == "error":
                    yield f"data: {json.dumps(_generation_error(value).body())}\n\n"
                    break
                else:
                    for line in out(thought.finish() if thought is not None else []):
                        yield line
                    if content is not None and (text := content.finish(bool(value.tool_calls))):
                        yield chunk(piece(text))
                    elif content is None and calls and value.text:
                        yield chunk(piece(value.text))
                    for i, call in enumerate(value.tool_calls or () if calls else ()):  # as OpenAI streams them
                        head = {"index": i, "id": call["id"], "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""}}
                        yield chunk({"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None})
                        yield chunk({"index": 0, "delta": {"tool_calls": [{"index": i, "function": {
                            "arguments": call["function"]["arguments"]}}]}, "finish_reason": None})
                    yield chunk(piece(None, value.finish_reason), specrt=_extension(value))
                    if include_usage:
                        yield chunk(None, usage=_usage(value))
                    break
            yield "data: [DONE]\n\n"
        finally:
            ticket.cancel()  # the client disconnected (or the stream ended): free the engine at once

    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    async def completions(request: Request):
        return await complete(request, chat=False)

    routes = Starlette(routes=[
        Route("/health", health), Route("/v1/models", models),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ], exception_handlers={HTTPException: _http_error, Exception: _server_error})
    return ServeGuard(routes, bind_host, allowed_hosts, cors_origins)
