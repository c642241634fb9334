"""The processes under one process, and their CPU, from ``/proc`` (Linux): what a worker started.

Shared by the harness's CPU clock of a worker (``cpu_clock``) and the worker's guard, which
holds the tree to its quota (``quotas``). Every reading tolerates a process that exits meanwhile.
"""

from __future__ import annotations

import os


def descendants(root: int) -> list[int]:
    """Every process under ``root``, parents before their children (threads' children included)."""
    found, queue = [], [root]
    while queue:
        pid = queue.pop(0)
        for child in children(pid):
            found.append(child)
            queue.append(child)
    return found


def children(pid: int) -> list[int]:
    """``pid``'s children, whichever of its threads forked them."""
    if not KERNEL_LISTS_CHILDREN:
        return children_by_parent(pid)
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone meanwhile
    return [child for thread in threads for child in listed(f"/proc/{pid}/task/{thread}/children")]


KERNEL_LISTS_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
"""Whether this kernel keeps a list of each thread's children (``CONFIG_PROC_CHILDREN``, on in
the common distributions' kernels). Without them, finding no children would silently leave a
worker's processes unbounded and their CPU uncharged: ``children`` reads every process's
parent instead."""


def children_by_parent(pid: int) -> list[int]:
    """``pid``'s children, found by reading every process's parent: needs no per-thread
    lists, at the cost of one read per process on the machine."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(entry)
        except OSError:
            continue  # exited meanwhile
        if len(fields) > 1 and fields[1] == str(pid).encode():
            found.append(int(entry))
    return found


def listed(path: str) -> list[int]:
    try:
        return [int(pid) for pid in read_small(path).split()]
    except (OSError, ValueError):
        return []  # gone meanwhile


def cpu_ticks(pid: int) -> list[int]:
    """``utime``, ``stime``, ``cutime`` and ``cstime`` of ``pid`` (clock ticks); zeros once it is gone."""
    try:
        return [int(f) for f in _stat_fields(pid)[11:15]]
    except (OSError, ValueError):
        return [0, 0, 0, 0]


def _stat_fields(pid: int | str) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command's name (which may hold spaces and
    parentheses): the state first, then the parent's pid, ..."""
    return read_small(f"/proc/{pid}/stat").rpartition(b")")[2].split()


def read_small(path: str) -> bytes:
    """A small /proc file (``open`` would cost twice as much: this runs once per cell)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = chunk = os.read(fd, 4096)
        while chunk:  # a children list past 4 KB (a plugin that forked hundreds)
            chunk = os.read(fd, 65536)
            data += chunk
        return data
    finally:
        os.close(fd)
