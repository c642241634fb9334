"""Confining a plugin worker with Landlock (Linux 5.13+; TCP rules from 6.7), through ctypes.

A process boundary keeps a plugin out of the harness's memory, not off the disk: without
this, a strategy could read the task's data file (answers included) or walk to the run
directory. Before its plugin is imported, a worker restricts itself for good: read-only on
the Python environment, the modules it has loaded and the paths the harness allows (the
plugin's code and its parameters' paths; once created, what the plugin declares, a second
layer that only narrows: whatever the plugin did to ``sys.modules`` cannot widen it);
read-write on its scratch folder, where it may make no device node; read-write on the
harmless devices (/dev/null, /dev/zero, /dev/full, /dev/random, /dev/urandom) and on the
files it makes in /dev/shm (POSIX semaphores: multiprocessing's locks, which tqdm takes),
whose folder it cannot list, so another worker's are out of reach unless named; no other
device (a root worker reading /dev/kmsg, or a disk's raw blocks); nothing else on disk; TCP
connections only to the ports the harness allows (its metering gateway and outside proxy);
no signal to, and no abstract Unix socket of, any process outside it (ABI 6); by a seccomp
filter (``seccomp``), no socket but TCP's (no UDP, Unix path, netlink, raw socket or
io_uring); and, as root, no capability (``capabilities``). The child that builds the plugin
index (``host.index``) is confined the same way before it imports the installed plugins:
their code, no write but a temporary folder, no TCP.

PyPI's ``landlock`` bindings were considered; the four system calls and three structures
below are all this needs, so no dependency. ``confine`` returns what it applied, recorded in
the run's identity; where Landlock is missing it returns ``{"sandbox": "none", ...}``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from pathlib import Path
from typing import Any

from . import capabilities, seccomp

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on x86_64 and aarch64
_VERSION_FLAG = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_PR_SET_NO_NEW_PRIVS = 38

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_CONNECT_TCP, _BIND_TCP = 1 << 1, 1 << 0
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6 (Linux 6.12)
_MAKE_CHAR, _MAKE_BLOCK = 1 << 6, 1 << 11
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_SHARED_MEMORY = "/dev/shm"


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """Landlock's ABI version on this kernel; 0 where there is none (not Linux, disabled)."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        return 0
    version = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION_FLAG))
    return max(0, int(version))


def python_environment() -> list[str]:
    """What a worker must read to run Python: the interpreter's prefixes, the import path's
    site folders, and the folder of every module already imported (editable installs)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(
        p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p or p.startswith(sys.base_prefix))
    )
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        if spec is None:
            continue
        for location in spec.submodule_search_locations or []:
            paths.add(location)
        if getattr(spec, "origin", None) and os.path.isabs(spec.origin):
            paths.add(os.path.dirname(spec.origin))
    return sorted(p for p in paths if os.path.exists(p))


_SYSTEM_READ = ("/proc/self", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/sys/devices/system/cpu",
                "/sys/fs/cgroup", "/etc/localtime", "/etc/ssl", "/etc/pki", "/usr/share/zoneinfo", "/etc/hosts",
                "/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/ld.so.cache", "/lib", "/lib64", "/usr/lib")  # fmt: skip


def confine(policy: dict[str, Any]) -> dict[str, Any]:
    """Restrict this process for good: ``policy`` has ``read`` (paths), ``write`` (paths),
    ``ports`` (TCP ports it may connect to) and ``list`` (folders whose entries' names, not
    contents, may be read: where importlib.metadata finds a distribution). Returns what was
    applied: Landlock's rules, the socket filter (``seccomp``) and the capabilities dropped, both
    even where Landlock is missing (the filter once: a second call keeps the first's)."""
    return {**_landlock(policy), "sockets": seccomp.install(), "capabilities": capabilities.drop_all()}


def _landlock(policy: dict[str, Any]) -> dict[str, Any]:
    version = abi_version()
    if version < 1:
        return {"sandbox": "none", "reason": "Landlock is not available on this kernel"}
    fs = _FS_ABI1 | (_REFER if version >= 2 else 0) | (_TRUNCATE if version >= 3 else 0)
    fs |= _IOCTL_DEV if version >= 5 else 0
    net = (_CONNECT_TCP | _BIND_TCP) if version >= 4 else 0
    # no signal to, and no abstract socket of, any process outside this worker: not the harness,
    # not a rival plugin's worker (which a hostile one could otherwise stop or kill)
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if version >= 6 else 0
    libc = _libc()
    attr = _RulesetAttr(fs, net, scoped)
    size = ctypes.sizeof(attr) if version >= 6 else _RulesetAttr.scoped.offset  # older kernels know two fields
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        return {"sandbox": "none", "reason": f"landlock_create_ruleset failed (errno {ctypes.get_errno()})"}
    read = fs & (_EXECUTE | _READ_FILE | _READ_DIR)
    ports = sorted(int(port) for port in policy.get("ports", []))
    try:
        allowed: dict[str, int] = {}
        for path in [*python_environment(), *_SYSTEM_READ, *policy.get("read", [])]:
            allowed[os.path.realpath(path)] = allowed.get(os.path.realpath(path), 0) | read
        for path in policy.get("list", []):
            allowed[os.path.realpath(path)] = allowed.get(os.path.realpath(path), 0) | _READ_DIR
        no_devices = fs & ~(_MAKE_CHAR | _MAKE_BLOCK)
        for path in policy.get("write", []):
            allowed[os.path.realpath(path)] = no_devices
        for path in _DEVICES:
            allowed[path] = fs & (_READ_FILE | _WRITE_FILE)
        allowed[_SHARED_MEMORY] = no_devices & ~_READ_DIR
        for path, rights in sorted(allowed.items()):
            _allow_path(libc, ruleset, path, rights)
        if net:
            for port in ports:
                rule = _NetPortAttr(_CONNECT_TCP, port)
                if libc.syscall(_ADD_RULE, ruleset, _RULE_NET_PORT, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule port {port}")
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return {
        "sandbox": f"landlock-abi-{version}",
        "network": (f"TCP connect to ports {ports} only, no bind" if ports else "no TCP connect or bind")
        if net
        else "unrestricted (Landlock ABI < 4: no TCP rules)",
        "signals": "its own process only" if scoped else "unrestricted (Landlock ABI < 6: no scopes)",
    }


def _allow_path(libc: Any, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist on this machine grants nothing
    try:
        if not Path(path).is_dir():
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(fd)
