"""A worker's own ``/dev/shm``: a tmpfs of its own size, in a mount namespace of its own (ctypes).

The machine's ``/dev/shm`` is one tmpfs for every process, often as large as half the memory
or all of it, and a file there outlives the process that made it. A worker may make files there
(multiprocessing's locks, shared memory of its own: ``landlock``), so on the shared one a plugin
could fill the machine's memory for the rest of the run and after it, or open a rival worker's
files by name. So before plugin code runs, its worker enters a mount namespace of its own,
whose mounts never propagate back, and mounts a tmpfs of the worker's memory quota on
``/dev/shm``: what it makes there is counted against that quota, seen by its own processes
only, and freed with the last of them.

It needs ``CAP_SYS_ADMIN``: a worker started as root has it until ``capabilities`` drops it;
any other user gets it in a user namespace of its own, where the kernel allows unprivileged
ones (its own uid and gid mapped to themselves, so files keep their owner). Where neither is
possible the worker keeps the machine's ``/dev/shm``, and ``private_shm`` says why.
"""

from __future__ import annotations

import ctypes
import os
import sys

_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000


def private_shm(size_bytes: int) -> str:
    """Mount a ``/dev/shm`` of ``size_bytes`` for this process and its children; returns
    ``"private"``, or ``"shared: <why>"`` when it stays the machine's."""
    if not sys.platform.startswith("linux"):
        return "shared: not Linux"
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWNS if uid == 0 else _CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        return f"shared: no mount namespace ({os.strerror(ctypes.get_errno())})"
    if uid != 0:
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as exc:
            return f"shared: no user namespace mapping ({exc.strerror})"
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"shared: mounts not made private ({os.strerror(ctypes.get_errno())})"
    options = f"size={size_bytes},mode=1777".encode()
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) != 0:
        return f"shared: no tmpfs mounted ({os.strerror(ctypes.get_errno())})"
    return "private"


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as out:
        out.write(text)
