"""A worker is held to its quota of the machine: scratch space, any one file, processes, memory.

Each hostile strategy below goes past one limit on every item and would then answer as
truncation does; run as root (here and in CI) nothing but the harness bounds it. With
``--worker-disk-mb 16 --worker-processes 8 --worker-memory-mb 256`` its cells must be error
rows naming the limit, while truncation in the same run gets its results, and nothing it
started or made in ``/dev/shm`` outlives the run.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
import uuid

import pytest

from budgetbench_core import RunConfig, hookimpl, run
from budgetbench_core.builtin.strategies import Truncation
from budgetbench_core.host.process_tree import read_small
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer, registry_with

DISK_MB, PROCESSES, MEMORY_MB = 16, 8, 256
HELD_S = 2.0  # how long a hog holds what it took before answering: the guard reads every 0.25 s


class Hog(Truncation):
    """Takes ``how`` much: ``files`` (1 MB files in nested folders, 64 MB in all), ``one_file``
    (32 MB in one, removed if the write fails), ``log`` (64 MB to stderr, errors ignored),
    ``deleted``, ``memfd`` and ``mapped`` (four 8 MB files no folder shows: deleted but open,
    memory files, deleted and only mapped), ``memory`` (512 MB at once), ``shm`` (320 MB in
    8 MB ``/dev/shm`` files), ``processes`` (40 sleeping children) or ``orphans`` (40 sleeping
    grandchildren whose parents exited), then answers."""

    name = "quota-hog"

    def __init__(self, how: str = "files", marker: str = "") -> None:
        super().__init__(how=how, marker=marker)
        self.how, self.marker = how, marker

    def apply(self, history, budget, context):
        folder = context.scratch_dir / "deep" / "er"
        folder.mkdir(parents=True, exist_ok=True)
        if self.how == "files":
            for index in range(64):
                (folder / f"{index}.bin").write_bytes(os.urandom(2**20))
        elif self.how == "one_file":  # removed as the write fails, so only the file limit can stop it
            try:
                with open(folder / "one.bin", "wb") as one:
                    for _ in range(32):
                        one.write(os.urandom(2**20))
            finally:
                (folder / "one.bin").unlink()
        elif self.how in ("deleted", "memfd", "mapped"):  # files no folder shows: 4 x 8 MB, held
            self.held = []
            for index in range(4):
                if self.how == "memfd":
                    fd = os.memfd_create(f"hidden-{index}")
                else:
                    fd = os.open(folder / f"hidden-{index}", os.O_RDWR | os.O_CREAT)
                    os.unlink(folder / f"hidden-{index}")
                os.write(fd, os.urandom(8 * 2**20))
                if self.how == "mapped":
                    self.held.append(mmap.mmap(fd, 8 * 2**20))
                    os.close(fd)
                else:
                    self.held.append(fd)
        elif self.how == "memory":
            self.held = bytearray(512 * 2**20)
        elif self.how == "shm":  # files under the file limit, together past the memory quota
            for index in range(40):
                with open(f"/dev/shm/{self.marker}-{os.getpid()}-{index}", "wb") as shared:
                    shared.write(b"x" * 8 * 2**20)
        elif self.how == "log":
            for _ in range(64):
                try:
                    sys.stderr.write("x" * 2**20)
                    sys.stderr.flush()
                except OSError:
                    pass
        else:
            sleeper = [sys.executable, "-c", "import time; time.sleep(60)", self.marker]
            for _ in range(40):
                if self.how == "processes":
                    subprocess.Popen(sleeper, start_new_session=True)
                elif os.fork() == 0:  # orphans: the child starts a sleeper and exits at once
                    subprocess.Popen(sleeper, start_new_session=True)
                    os._exit(0)
        time.sleep(HELD_S)
        return super().apply(history, budget, context)


PLUGIN = types.SimpleNamespace(register_strategies=hookimpl(lambda register: [register(Hog)]))


def user_namespaces() -> bool:
    """Whether this user may make a user namespace (where a worker then mounts its /dev/shm)."""
    return subprocess.run(["unshare", "--user", "--map-current-user", "true"], capture_output=True).returncode == 0


def alive_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in read_small(f"/proc/{entry}/cmdline"):
                    found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.mark.parametrize(
    ("how", "cause"),
    [
        ("files", f"went past its {DISK_MB} MB of scratch space"),
        ("log", f"went past its {DISK_MB} MB of scratch space"),
        ("deleted", f"went past its {DISK_MB} MB of scratch space"),
        ("memfd", f"went past its {DISK_MB} MB of scratch space"),
        ("mapped", f"went past its {DISK_MB} MB of scratch space"),
        ("one_file", "File too large"),
        ("memory", "MemoryError"),
        ("shm", "No space left on device"),
        ("processes", f"had more than {PROCESSES} processes at once"),
        ("orphans", f"had more than {PROCESSES} processes at once"),
    ],
)
def test_a_worker_past_its_quota_is_an_error_row_naming_it_and_the_run_goes_on(tmp_path, how, cause):
    """Old code: no quota at all, so every hog cell was a result (and as root nothing would have
    stopped one that kept going), and the ``/dev/shm`` files stayed after the run."""
    if os.getuid() != 0 and not user_namespaces():
        pytest.skip("no private /dev/shm here: not root, and no unprivileged user namespaces")
    if how == "mapped" and os.getuid() != 0:
        pytest.skip("a guard reads what a mapping holds only as root (/proc/PID/map_files)")
    marker = f"budgetbench-quota-test-{uuid.uuid4().hex}"
    out = tmp_path / "run"
    try:
        hog_run(out, how, marker)
    finally:
        left_in_shm = [name for name in os.listdir("/dev/shm") if name.startswith(marker)]
        for name in left_in_shm:
            os.unlink(f"/dev/shm/{name}")
    rows = list(final_rows(out).values())
    hogs = [r for r in rows if r["strategy"] == "quota-hog"]
    assert [r["event"] for r in hogs] == ["error", "error"], hogs
    for row in hogs:
        assert "quota-hog" in row["cause"] and cause in row["cause"], row["cause"]
    assert [r["event"] for r in rows if r["strategy"] == "truncation"] == ["result", "result"]
    assert alive_with(marker) == []
    assert left_in_shm == []  # the worker's /dev/shm was its own, gone with it
    shared = json.loads((out / "manifest.json").read_text())["invocations"][-1]["plugin_shared_memory"]
    assert shared == {"quota-hog": "private", "truncation": "private"}


def hog_run(out, how: str, marker: str) -> None:
    with FaultServer() as server:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["quota-hog", "truncation"],
                budgets=[300],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": 2, "history_tokens": 600},
                max_concurrency=1,
                retries=0,
                strategy_params={"quota-hog": {"how": how, "marker": marker}},
                worker_disk_mb=DISK_MB,
                worker_processes=PROCESSES,
                worker_memory_mb=MEMORY_MB,
            ),
            registry=registry_with(PLUGIN, distribution="quota-hogs"),
        )


def test_a_folder_the_guard_may_not_read_counts_as_past_the_quota():
    """Old code skipped it: as any user but root, a plugin could fill a folder, take away its
    read permission, and the guard's reading left it out."""
    root = os.getuid() == 0
    scratch = tempfile.mkdtemp(prefix="budgetbench-quota-test-")  # under /tmp: reachable by the user below
    try:
        hidden = os.path.join(scratch, "hidden")
        os.mkdir(hidden)
        with open(os.path.join(hidden, "big"), "wb") as big:
            big.write(os.urandom(2**20))
        if root:  # the guard of a worker run by another user, which is not root's to bypass
            for path in (scratch, hidden, os.path.join(hidden, "big")):
                os.chown(path, 65534, 65534)
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if root else []
        code = (
            "import sys; from budgetbench_core.host.quotas import folder_bytes; print(folder_bytes(sys.argv[1], 2**30))"
        )

        def read() -> int:
            done = subprocess.run([*as_user, sys.executable, "-c", code, scratch], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            return int(done.stdout)

        assert 2**20 <= read() < 2**30
        os.chmod(hidden, 0)
        assert read() > 2**30
    finally:
        os.chmod(hidden, 0o700)
        shutil.rmtree(scratch)
