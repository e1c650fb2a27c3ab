"""Stop a long job cleanly on SIGINT, SIGTERM or SIGHUP: the signal becomes a KeyboardInterrupt, raised only where
Python code can take it.

Python's own SIGINT handler raises wherever the main thread happens to be. Inside an import that is unsafe: a
half-initialised native module can abort the process (exit -6, seen in CI while transformers was being imported)
or leave CPython convinced that an interrupt went unhandled, so that it kills itself with SIGINT at exit (-2)
after the conversion had already cleaned up and printed "interrupted"; some libraries' imports even swallow the
exception, and so does every finalizer (`__del__`). So a signal that lands inside an import or a finalizer is held and
retried every 50 ms on a timer (SIGALRM) until it has finished, then raised.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
RETRY_S = 0.05
_IMPORT_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")


def _unsafe(frame) -> bool:
    """Inside an import, or inside a finalizer (`__del__`), where CPython prints an exception and drops it (seen: a
    SIGTERM retried inside regex's SetBase.__del__ during a conversion, which then ran to its end)."""
    while frame is not None:
        if frame.f_code.co_filename in _IMPORT_FILES or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


class interrupt_on_signals:
    """Context manager: within it the SIGNALS raise KeyboardInterrupt (held while an import runs); outside it the
    handlers that were there before are back. Only the main thread can install handlers: elsewhere it does
    nothing."""

    def __enter__(self):
        self.saved = {}
        self.pending = False
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in SIGNALS + ("SIGALRM",):
            if hasattr(signal, name):
                handler = self._retry if name == "SIGALRM" else self._on_signal
                self.saved[name] = signal.signal(getattr(signal, name), handler)
        return self

    def _on_signal(self, signum, frame):
        self.pending = True
        self._raise_if_safe(frame)

    def _retry(self, signum, frame):
        if self.pending:
            self._raise_if_safe(frame)

    def _raise_if_safe(self, frame):
        if _unsafe(frame):
            if hasattr(signal, "setitimer"):
                signal.setitimer(signal.ITIMER_REAL, RETRY_S)
            return
        self.pending = False
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if "SIGALRM" in self.saved and hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, 0)
        for name, handler in self.saved.items():
            signal.signal(getattr(signal, name), handler)
        return False
