"""The HTTP connection of `specrt serve`: uvicorn's h11 protocol with a deadline on the request head.

uvicorn times a connection out only while it idles between requests (keep-alive); a client that sends its request
line and headers a byte a second holds its connection, and a thousand such clients hold the server, for as long as
they like. HeadDeadline closes a connection whose request head has not arrived within `head_timeout` seconds of
the connection opening or of the previous response ending. The body has its own deadline in the app
(app/serve/app.py), and uvicorn's limit_concurrency caps the connections.
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol


def head_deadline_protocol(head_timeout: float):
    """An h11 protocol class for uvicorn.Config(http=...) that drops slow request heads after head_timeout s."""

    class HeadDeadline(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_timer = None
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(head_timeout, self._head_timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _waiting_for_head(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def data_received(self, data: bytes) -> None:
            if self._waiting_for_head():  # bytes of a (next) request head: its clock runs from its first byte
                self._arm()
            super().data_received(data)
            if not self._waiting_for_head():  # the head is in: the request is the app's now
                self._disarm()

        def on_response_complete(self) -> None:
            self._disarm()  # idle until the next request: uvicorn's keep-alive timeout
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self._waiting_for_head() and not self.transport.is_closing():
                self.transport.close()

    return HeadDeadline
