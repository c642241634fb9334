"""The sockets a confined process may open: TCP only, by a seccomp filter (through ctypes).

Landlock governs TCP ports, signals and abstract Unix sockets, not the rest of the network: a
worker could still send a UDP datagram anywhere (a DNS query carrying what it read), connect to
a Unix socket by its path (Docker's, a Ray node's under /tmp/ray: Landlock does not mediate
``connect`` on a named socket), open netlink or raw sockets, or do any of it through io_uring,
whose operations no system call filter sees. So ``confine`` also installs this filter:
``socket`` only for TCP over IPv4 or IPv6 (whose ports Landlock then limits), ``socketpair``
only for Unix pairs (asyncio's self-pipe, multiprocessing: they reach no one outside), no
io_uring. A refused call fails with ``EACCES`` (``PermissionError`` in Python), so a plugin's
own error handling runs and its cell is an error row, not a dead worker. It needs only
``no_new_privs``, not Landlock, and is installed before any plugin code runs, so every thread
the plugin starts inherits it.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import socket
import sys
from typing import Any

SUMMARY = "TCP only (seccomp): no UDP, Unix path, netlink, raw or io_uring"

# per architecture: its AUDIT_ARCH value and the numbers of socket and socketpair
_ARCHES = {"x86_64": (0xC000003E, 41, 53), "aarch64": (0xC00000B7, 198, 199)}
_IO_URING = (425, 427)  # io_uring_setup, _enter, _register: the same on both
_X32_BIT = 0x40000000  # x86_64's x32 system calls (none on aarch64, refused alike)

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_ALLOW, _DENY, _KILL = 0x7FFF0000, 0x00050000 | errno.EACCES, 0x80000000  # SECCOMP_RET_*
_LOAD, _AND, _RET = 0x20, 0x54, 0x06  # BPF_LD|W|ABS, BPF_ALU|AND|K, BPF_RET|K
_JEQ, _JGE, _JGT = 0x15, 0x35, 0x25  # BPF_JMP|J..|K
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


def _arg(n: int) -> int:
    """Offset of the low 32 bits (both machines are little-endian) of system call argument
    ``n``: the int ``socket`` reads."""
    return 16 + 8 * n


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def supported() -> bool:
    """Whether this machine runs the 64-bit Linux this filter is written for."""
    return sys.platform.startswith("linux") and platform.machine() in _ARCHES and sys.maxsize > 2**32


def _program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for ``machine``: (code, jt, jf, k), where a jump skips jt (true) or jf (false)
    instructions."""
    arch, socket_nr, socketpair_nr = _ARCHES[machine]
    return [
        (_LOAD, 0, 0, _ARCH),
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, _KILL),  # another architecture's numbering (i386's int 0x80 on x86_64)
        (_LOAD, 0, 0, _NR),
        (_JGE, 0, 1, _X32_BIT),
        (_RET, 0, 0, _DENY),
        (_JGE, 0, 2, _IO_URING[0]),
        (_JGT, 1, 0, _IO_URING[1]),
        (_RET, 0, 0, _DENY),
        (_JEQ, 0, 4, socketpair_nr),
        (_LOAD, 0, 0, _arg(0)),
        (_JEQ, 0, 1, socket.AF_UNIX),
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _DENY),
        (_JEQ, 0, 9, socket_nr),  # any other system call: allowed
        (_LOAD, 0, 0, _arg(0)),  # domain
        (_JEQ, 1, 0, socket.AF_INET),
        (_JEQ, 0, 7, socket.AF_INET6),
        (_LOAD, 0, 0, _arg(1)),  # type, without SOCK_NONBLOCK and SOCK_CLOEXEC
        (_AND, 0, 0, 0xF),
        (_JEQ, 0, 4, socket.SOCK_STREAM),
        (_LOAD, 0, 0, _arg(2)),  # protocol: TCP, not SCTP or MPTCP, which Landlock's rules do not cover
        (_JEQ, 1, 0, 0),
        (_JEQ, 0, 1, socket.IPPROTO_TCP),
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _DENY),
    ]


_installed = False  # on this process already: a second copy would only run on every system call


def install() -> str:
    """Install the filter on this process for good, once; returns what was applied, for the record."""
    global _installed
    if not supported():
        return f"unrestricted (no seccomp filter for {sys.platform} {platform.machine()})"
    if _installed:  # a plugin that clears this flag only skips a copy: the one installed stays
        return SUMMARY
    libc: Any = ctypes.CDLL(None, use_errno=True)
    instructions = _program(platform.machine())
    code = (_Instruction * len(instructions))(*(_Instruction(*i) for i in instructions))
    filter_program = _Program(len(instructions), code)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # Landlock sets it too; where it is missing, this does
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(filter_program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    _installed = True
    return SUMMARY
