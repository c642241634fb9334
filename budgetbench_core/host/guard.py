"""A worker's guard: the process the harness starts, which forks the plugin's worker and, when
that worker ends, ends every process it left behind.

Killing a worker's process group does not reach a process the plugin moved out of it
(``setsid`` in a forked child whose parent then exits): such a process would outlive its
worker and the run. The guard never runs plugin code and is outside the worker's Landlock
domain, so the plugin can neither signal nor trace it (ABI 6). It is the worker's
child subreaper: every orphan of the worker's tree becomes the guard's child, whatever
session or group it moved to. When the worker exits, is killed (``remote.WorkerProcess.kill``
signals the worker alone) or the harness dies, the guard kills all its children until none is
left, then exits as the worker did, so the harness reads the worker's own exit status. It
also holds the worker to its ``quotas.Quota``: it gives the worker a ``/dev/shm`` of its own
and the worker's limits (one file, memory) before any plugin code, then reads its scratch
space and processes; past either, it ends the tree the same way and exits with the quota's code.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from multiprocessing.connection import Connection

from . import quotas, wire
from .private_shm import private_shm
from .process_tree import children_by_parent, descendants

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_WATCHED = {signal.SIGCHLD, signal.SIGTERM}


def stand(conn: Connection, quota: quotas.Quota) -> None:
    """Fork the worker and guard it; returns only in the worker. The first frame on ``conn``
    names the worker's pid (the process the harness meters and kills) and whether its
    ``/dev/shm`` is its own (``private_shm``)."""
    if not sys.platform.startswith("linux"):  # no subreaper: this process is the worker, its file size limited
        quotas.limit_this_process(quota)
        wire.send(conn, {"worker_pid": os.getpid(), "shared_memory": "shared: not Linux"})
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # the harness died: end the worker's tree, then go
    if os.getppid() == 1:
        os._exit(0)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    guard = os.getpid()
    shared_memory = private_shm(quota.memory_bytes)  # the worker's, and this process's: no plugin code here
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)  # taken with sigtimedwait: none is lost
    worker = os.fork()
    if worker == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the guard is gone: so is the worker
        if os.getppid() != guard:
            os._exit(0)
        os.setpgid(0, 0)
        quotas.limit_this_process(quota)
        _first_to_go_out_of_memory()
        return
    wire.send(conn, {"worker_pid": worker, "shared_memory": shared_memory})
    conn.close()  # this process's copy: the worker's exit is then the harness's end of file
    status, over = _wait_for(worker, quota)
    if over is not None:
        _kill(worker)
    _end_all_children()
    if over is not None:
        with contextlib.suppress(OSError):  # its log may be what filled the disk
            print(
                f"budgetbench guard: the worker {quotas.describe_exit(quotas.EXIT_CODES[over], quota)}", file=sys.stderr
            )
        os._exit(quotas.EXIT_CODES[over])
    _exit_as(status)


def _first_to_go_out_of_memory() -> None:
    """A plugin that exhausts memory is the process the kernel kills, not the harness (its
    confinement keeps it from writing this back: /proc/self is read-only to it)."""
    try:
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as adj:
            adj.write("1000")
    except OSError:
        pass  # a kernel without the setting: the kernel's own choice stands


def _wait_for(worker: int, quota: quotas.Quota) -> tuple[int, str | None]:
    """The worker's wait status once it exits, or the quota it went past first (key of
    ``quotas.EXIT_CODES``); the guard's own SIGTERM (the harness is gone) kills it."""
    me, scratch = os.getpid(), os.getcwd()  # started in the worker's scratch folder
    while True:
        received = signal.sigtimedwait(_WATCHED, quotas.POLL_S)
        if received is not None and received.si_signo == signal.SIGTERM:
            _kill(worker)
        for pid, status in _reaped():
            if pid == worker:
                return status, None
        over = quotas.exceeded(quota, scratch, descendants(me))
        if over is not None:
            return 0, over


def _reaped() -> list[tuple[int, int]]:
    """Every child that has exited, reaped now."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def _end_all_children() -> None:
    """Kill every child (the worker's orphans, reparented here) until none is left: a child's
    own children become this process's as it dies, and are killed in the next round. They are
    found by every process's parent, not the kernel's per-thread lists, which may miss a child
    forked while they are read: a child missed here would leave the wait below hanging."""
    while True:
        for pid in children_by_parent(os.getpid()):
            _kill(pid)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        _reaped()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _exit_as(status: int) -> None:
    """End this process as the worker ended: its exit code, or the signal that killed it."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught anyway
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {number})
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)
