"""How much of the machine one plugin worker may use: scratch space, one file, processes, memory.

Landlock says where a worker may write, not how much, and as root ``RLIMIT_NPROC`` does not
apply (the kernel exempts uid 0), so a plugin could otherwise fill the disk the run's log is on
or fork until nothing else can start. Its guard (``guard``: outside the Landlock domain, running
no plugin code) holds it to a ``Quota``:

- any one file the worker's processes write, its log included, is at most ``disk_bytes``
  (``RLIMIT_FSIZE``, set before plugin code runs: a longer write fails with ``EFBIG``, which
  Python raises as ``OSError``, having ignored ``SIGXFSZ``); no core dump is written;
- each of its processes allocates at most ``memory_bytes`` (``RLIMIT_DATA``: heap and private
  mappings; past it Python raises ``MemoryError``), and its ``/dev/shm`` is a tmpfs of that
  size of its own (``private_shm``); the kernel's out-of-memory killer takes a worker first
  (``guard``) should its processes together still exhaust the machine;
- every ``POLL_S`` the guard reads the scratch folder's size (blocks, all files; an entry count
  past ``MAX_ENTRIES``, or an entry it may not read, counts as over) plus the files its
  processes hold that no folder shows (deleted while open or mapped, memory files), and the
  number of processes under it; past either limit it kills the worker and everything it
  started and exits with ``EXIT_CODES``' code, which the harness names in the cell's error row
  (``describe_exit``). The folder of a worker that ended is removed at once
  (``remote.WorkerProcess.kill``), so the space comes back.

Between two readings a plugin can go past the folder's limit by what it writes in ``POLL_S``.
A plugin that exits with one of these codes itself is described as over its quota: it only
mislabels its own error row.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field

from .process_tree import read_small

POLL_S = 0.25
MAX_ENTRIES = 100_000  # files and folders in a scratch folder; reading more would cost the guard too much
EXIT_CODES = {"disk": 86, "processes": 87}


def half_the_memory() -> int:
    """Bytes: the default memory quota, half of this machine's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


@dataclass(frozen=True)
class Quota:
    disk_bytes: int = 4096 * 2**20  # the scratch folder, and any one file the worker writes
    processes: int = 64  # under the guard at once, the worker included
    memory_bytes: int = field(default_factory=half_the_memory)  # each process's data, and its /dev/shm

    def to_argv(self) -> list[str]:
        return [str(self.disk_bytes), str(self.processes), str(self.memory_bytes)]

    @classmethod
    def from_argv(cls, argv: list[str]) -> Quota:
        return cls(int(argv[0]), int(argv[1]), int(argv[2]))


def limit_this_process(quota: Quota) -> None:
    """In the worker, before plugin code: no file past the disk quota, no core dump (in the
    scratch folder), no process's data (heap and private mappings) past the memory quota."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (quota.disk_bytes, quota.disk_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_DATA, (quota.memory_bytes, quota.memory_bytes))


def exceeded(quota: Quota, folder: str, tree: list[int]) -> str | None:
    """The key of ``EXIT_CODES`` of the limit that ``folder`` (with the hidden files the
    processes ``tree`` hold) or the number of those processes is past, or None."""
    if len(tree) > quota.processes:
        return "processes"
    if folder_bytes(folder, quota.disk_bytes) + held_bytes(tree) > quota.disk_bytes:
        return "disk"
    return None


def folder_bytes(folder: str, limit: int) -> int:
    """Bytes ``folder`` holds on disk (blocks allocated, so a sparse file counts what it uses);
    stops early once past ``limit`` or ``MAX_ENTRIES`` (then returns more than ``limit``). An
    entry the guard may not read (only the plugin can have made it so) counts as past."""
    total, entries, pending = 0, 0, [folder]
    while pending:
        try:
            with os.scandir(pending.pop()) as listing:
                for entry in listing:
                    entries += 1
                    if entries > MAX_ENTRIES:
                        return limit + 1
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except FileNotFoundError:
                        continue  # removed meanwhile
                    except OSError:
                        return limit + 1
        except FileNotFoundError:
            continue  # removed meanwhile
        except OSError:
            return limit + 1
        if total > limit:
            return total
    return total


def held_bytes(tree: list[int]) -> int:
    """Bytes of the files the processes ``tree`` hold that no folder shows: files deleted while
    open or mapped, and memory files (``memfd_create``), each counted once."""
    seen, total = set(), 0
    for pid in tree:
        for path in _held_paths(pid):
            try:
                stat = os.stat(path)
            except OSError:
                continue  # closed or unmapped meanwhile; as another user than root, mappings are not readable
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_blocks * 512
    return total


def _held_paths(pid: int) -> list[str]:
    """``/proc`` paths of the deleted files (memory files included) ``pid`` holds open or mapped."""
    paths = []
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        descriptors = []  # gone meanwhile
    for fd in descriptors:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith(" (deleted)"):  # a memfd's name ends so too
                paths.append(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    try:
        maps = read_small(f"/proc/{pid}/maps")
    except OSError:
        maps = b""
    if b" (deleted)" in maps:
        for line in maps.splitlines():
            if line.endswith(b" (deleted)"):
                paths.append(f"/proc/{pid}/map_files/{line.split(maxsplit=1)[0].decode()}")
    return paths


def describe_exit(code: int | None, quota: Quota) -> str | None:
    """What a guard's exit ``code`` says its worker went past, or None for any other exit."""
    if code == EXIT_CODES["disk"]:
        return f"went past its {quota.disk_bytes // 2**20} MB of scratch space (--worker-disk-mb)"
    if code == EXIT_CODES["processes"]:
        return f"had more than {quota.processes} processes at once (--worker-processes)"
    return None
