"""A plugin worker's CPU seconds, read from outside it, every process it started included.

A worker's cost is the harness's measurement, not the worker's word. The worker's own clock
(``clock_getcpuclockid``: every thread, ns resolution) leaves out its child processes, so a
plugin that ran its work in a subprocess or a multiprocessing pool, or in a daemon it
detached, would look free. So the reading adds, from ``/proc`` (clock ticks, 10 ms):

- every live or exited-but-unreaped process under the worker's guard (the worker's children
  and theirs, and the orphans the guard adopted as their subreaper), its own seconds and
  those of the children it reaped;
- the seconds of the children the worker and the guard reaped (``cutime`` and ``cstime``).

A child that exits and is reaped between two of the reading's steps is missed by that
reading and found by the next in its parent's total: its seconds go to the worker's next
cell. None of this is on the worker's side of the Landlock boundary: it cannot change it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable

from .process_tree import children, cpu_ticks, descendants

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def worker_cpu_clock(guard: int, worker: int) -> Callable[[], float | None] | None:
    """A reader of the CPU seconds of ``worker`` and every process under its ``guard`` (its
    parent, on Linux); None where the platform has no such clock (not Linux); the reader returns
    None once the worker is gone (its last seconds cannot be read)."""
    own = _process_clock(worker)
    if own is None:
        return None

    def read() -> float | None:
        seconds = own()
        if seconds is None:
            return None
        ticks = sum(cpu_ticks(worker)[2:])  # its own seconds are the clock's, to the nanosecond
        ticks += sum(cpu_ticks(guard)[2:])  # the guard's own seconds are the harness's overhead
        # the guard's children: the worker, and the orphans it adopted
        for child in children(guard):
            ticks += sum(cpu_ticks(child)) if child != worker else 0
            ticks += sum(sum(cpu_ticks(pid)) for pid in descendants(child))
        return seconds + ticks * _TICK_S

    return read


def _process_clock(pid: int) -> Callable[[], float | None] | None:
    if not sys.platform.startswith("linux"):
        return None
    clock = ctypes.c_int()
    if ctypes.CDLL(None).clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        return None

    def read() -> float | None:
        try:
            return time.clock_gettime(clock.value)
        except OSError:
            return None

    return read
