"""One generation at a time on the engine, first come first served, from a bounded queue.

A request becomes a Ticket; a worker thread runs tickets in order and hands their text chunks to the request's
event loop. A ticket whose client went away is cancelled: the worker stops its generation at the next chunk
(closing the engine's generator releases the engine at once) or skips it if it has not started. When
`queue_size` tickets are waiting or running, submit raises QueueFull (the server answers 503).
"""

from __future__ import annotations

import asyncio
import queue
import threading

from specrt.errors import SpecrtError


class QueueFull(Exception):
    pass


class Ticket:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()

    def put(self, kind: str, value=None) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))

    def cancel(self) -> None:
        self.cancelled.set()


class EngineWorker:
    def __init__(self, engine, queue_size: int = 16):
        self.engine, self.queue_size = engine, queue_size
        self.jobs: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.active = 0  # tickets waiting or running
        threading.Thread(target=self._loop, name="specrt-engine", daemon=True).start()

    def submit(self, job) -> Ticket:
        with self.lock:
            if self.active >= self.queue_size:
                raise QueueFull(f"{self.active} requests are queued or running (limit {self.queue_size})")
            self.active += 1
        ticket = Ticket(asyncio.get_running_loop())
        self.jobs.put((job, ticket))
        return ticket

    def _loop(self) -> None:
        while True:
            job, ticket = self.jobs.get()
            try:
                if not ticket.cancelled.is_set():
                    self._run(job, ticket)
            finally:
                with self.lock:
                    self.active -= 1

    def _run(self, job, ticket: Ticket) -> None:
        try:
            gen = self.engine.generate(job.prompt, job.params, raw=job.raw, ids=job.ids,
                                       response_format=job.response_format, tools=job.tools,
                                       tool_choice=job.tool_choice, parallel_tool_calls=job.parallel_tool_calls,
                                       thinking=job.thinking, reasoning_effort=job.reasoning_effort,
                                       reasoning_inline=job.reasoning_inline)
            try:
                for chunk in gen:
                    if ticket.cancelled.is_set():
                        break
                    ticket.put("text", chunk)
            finally:
                gen.close()  # a cancelled generation ends here: the engine is free for the next ticket
            ticket.put("cancelled" if ticket.cancelled.is_set() else "done", gen.result)
        except SpecrtError as exc:
            ticket.put("error", exc)
        except Exception as exc:  # noqa: BLE001 - the server reports it and keeps serving
            ticket.put("error", exc)
