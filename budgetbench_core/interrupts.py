"""Ctrl-C during a command: the first stops sending and says what it waits for, the second stops now.

The first SIGINT sends no further model call (``model_calls.stop_sending``), prints at once
how many calls are in flight and for how long they may still run, and raises
KeyboardInterrupt in the main thread as Python does, so the run winds down as before:
finished rows stay, the manifest says the invocation did not finish. The second SIGINT
exits with 130 within moments, whatever the threads are doing (an embedded llama.cpp
server shutting down, calls in flight): every row is flushed to its file as it is written,
so nothing finished is lost, and a resume repairs a line cut mid-write.

The signal is also read from a wakeup file descriptor by a small thread, so the second
Ctrl-C works even while the main thread is blocked in native code, where Python's own
handler would not run until that code returned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator

from .model_calls import InFlight, calls_in_flight, stop_sending

EXIT_INTERRUPTED = 130


def waiting_message(calls: list[InFlight]) -> str:
    """What the first Ctrl-C waits for, and how to stop at once."""
    again = "press Ctrl-C again to stop now (finished rows are kept)"
    if not calls:
        return f"interrupted: sending no more model calls; stopping after the cells in progress; {again}"
    bounded = [c.remaining_s for c in calls if c.remaining_s is not None]
    unbounded = [c for c in calls if c.remaining_s is None]
    parts = []
    if bounded:
        parts.append(f"{len(bounded)} within their deadline (up to {max(bounded):.0f} s)")
    if unbounded:
        doing = next((c.activity for c in unbounded if c.activity), None)
        parts.append(
            f"{len(unbounded)} on {unbounded[0].plugin} with no total deadline, ending when the server "
            f"finishes or stalls" + (f" ({doing})" if doing else "")
        )
    noun = "call" if len(calls) == 1 else "calls"
    return (
        f"interrupted: sending no more model calls; waiting for {len(calls)} {noun} in flight: "
        f"{'; '.join(parts)}; {again}"
    )


class Interrupts:
    """The SIGINT handling of one command (main thread only); ``write`` prints a line to the user."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.count = 0
        self._lock = threading.Lock()
        self._announced = False

    def _first(self) -> None:
        """Stop sending and say what is left (once, from whichever path sees the signal first)."""
        with self._lock:
            if self._announced:
                return
            self._announced = True
        stop_sending("the run was interrupted (Ctrl-C)")
        self.write(waiting_message(calls_in_flight()))

    def stop_now(self) -> None:
        """The second Ctrl-C: exit 130 at once (rows are on disk already; nothing else is waited for)."""
        with contextlib.suppress(Exception):
            self.write("stopped: finished rows are saved; run the same command again to resume")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_INTERRUPTED)

    def _handler(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count == 1:
            self._first()
            raise KeyboardInterrupt
        self.stop_now()

    def _watch(self, reader: socket.socket) -> None:
        """The wakeup descriptor's reader: each byte is one signal, seen even when the main thread
        is stuck in native code."""
        seen = 0
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            seen += data.count(signal.SIGINT)
            if seen >= 1:
                self._first()
            if seen >= 2:
                self.stop_now()


@contextlib.contextmanager
def handled(write: Callable[[str], None]) -> Iterator[Interrupts | None]:
    """Ctrl-C handling around a command; the previous handler and wakeup descriptor come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    interrupts = Interrupts(write)
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = signal.signal(signal.SIGINT, interrupts._handler)
    try:
        previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:
        previous_fd = None
    threading.Thread(target=interrupts._watch, args=(reader,), name="interrupts", daemon=True).start()
    try:
        yield interrupts
    finally:
        if previous_fd is not None:
            signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous)
        writer.close()
        with contextlib.suppress(OSError):
            reader.shutdown(socket.SHUT_RDWR)
        reader.close()
