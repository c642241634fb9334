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
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone meanwhile
    return [child for thread in threads for child in listed(f"/proc/{pid}/task/{thread}/children")]


def listed(path: str) -> list[int]:
    try:
        return [int(pid) for pid in read_small(path).split()]
    except (OSError, ValueError):
        return []  # gone meanwhile


def cpu_ticks(pid: int) -> list[int]:
    """``utime``, ``stime``, ``cutime`` and ``cstime`` of ``pid`` (clock ticks); zeros once it is gone."""
    try:
        fields = read_small(f"/proc/{pid}/stat").rpartition(b")")[2].split()
        return [int(f) for f in fields[11:15]]
    except (OSError, ValueError):
        return [0, 0, 0, 0]


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
