"""A confined process gives up every Linux capability (through ctypes).

Run as root (a container, a CI runner), a worker would otherwise keep root's capabilities
inside its Landlock domain: create a device node for the disk in its scratch folder
(``CAP_MKNOD``) and read the task's data off the raw device, load a kernel module, change
file ownership or the clock. Landlock governs paths, not these. So ``confine`` empties the
bounding set (nothing regained by executing a program), the ambient set, and the effective,
permitted and inheritable sets. A process that holds no capability (the usual user) loses
nothing. It needs no Landlock, so it applies wherever ``confine`` runs.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def effective() -> int:
    """This process's effective capabilities, as a bit mask (0 where there are none, or off Linux)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def drop_all() -> str:
    """Give up every capability for good; returns what the run's identity records."""
    if not sys.platform.startswith("linux"):
        return "none (not Linux)"
    libc: Any = ctypes.CDLL(None, use_errno=True)
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 63
    for capability in range(last + 1):  # refused without CAP_SETPCAP: then none was held to drop
        libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    held = effective()
    refused = libc.capset(ctypes.byref(_Header(_CAPABILITY_VERSION_3, 0)), (_Data * 2)()) != 0
    still = effective()
    if still:  # never run a plugin holding one
        raise OSError(ctypes.get_errno() if refused else 0, f"capabilities still held after capset: {still:#x}")
    return f"none (dropped {held:#x})" if held else "none"
