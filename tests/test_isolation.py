"""The plugin host: a strategy runs in a confined worker process of its own.

Each hostile strategy here tries one route a vendor could take to its score (the grading key
in the harness's memory, the counter or gate, the run directory, the cache, the task's data
file, the model server directly, a worker that hangs or exits) and reports what it reached in
its audit. Each is run beside its honest twin (truncation) on the same items: it must score
what the twin scores, and the run directory must still verify.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.machinery
import os
import platform
import socket
import sys
import threading
import time
import types
import urllib.parse
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, hookimpl, run
from budgetbench_core.builtin.strategies import Truncation
from budgetbench_core.host import seccomp
from budgetbench_core.host.landlock import abi_version
from budgetbench_core.integrity import verify_run
from budgetbench_core.messages import Item, Message
from budgetbench_core.runlog import final_rows, iter_events
from budgetbench_core.testing import FaultServer, registry_with, tokenizer_for
from budgetbench_core.tokenizers import PromptCounter

TASK_OPTIONS = {"items": 4, "history_tokens": 600}
LANDLOCK = abi_version() >= 4  # file and TCP rules
SCOPES = abi_version() >= 6  # no signal to a process outside the worker
SOCKET_FILTER = LANDLOCK and seccomp.supported()  # workers are confined, and the filter applies here


def answers() -> dict[str, str]:
    from budgetbench_core.builtin.synthetic_memory import SyntheticMemory

    return {item.query.content: str(item.answer) for item in SyntheticMemory(**TASK_OPTIONS).load(None, 0)}


def is_first_item(view: Item) -> bool:
    """Whether a view is of the run's first item, known by its question (a view's id is opaque)."""
    from budgetbench_core.builtin.synthetic_memory import SyntheticMemory

    first = next(iter(SyntheticMemory(**TASK_OPTIONS).load(None, 0)))
    return view.query.content == first.query.content


def gold_reply(messages) -> str:
    """A 'model' that answers correctly only when the prompt carries the answer itself."""
    known = answers()
    text = " ".join(m["content"] for m in messages)
    return next((a for a in known.values() if f"ANSWER={a}" in text), "no idea")


def attempt(action) -> str:
    """What happened when the strategy tried ``action``: 'reached' or the error it got."""
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - a refusal of any kind is what we want to see
        return type(exc).__name__
    return "reached"


class GcSpy(Truncation):
    """Searches its process's objects and frames for an item with its answer, and puts it in the prompt."""

    name = "hostile-gc-spy"

    def apply(self, history, budget, context):
        gc.unfreeze()  # the worker's start-up objects are frozen, out of get_objects' sight: not for long
        found = [o.answer for o in gc.get_objects() if isinstance(o, Item) and o.answer is not None]
        for frame in sys._current_frames().values():
            while frame is not None:
                found += [v.answer for v in frame.f_locals.values() if isinstance(v, Item) and v.answer]
                frame = frame.f_back
        context.audit["found"] = sorted({str(a) for a in found})
        context.audit["pid"] = os.getpid()
        prompt = super().apply(history, budget, context)
        if found:
            prompt.insert(-1, Message("user", " ".join(f"ANSWER={a}" for a in context.audit["found"])))
        return prompt


class Patcher(Truncation):
    """Patches the counter, the gate and the run log in its process, then sends the whole history."""

    name = "hostile-patcher"

    def apply(self, history, budget, context):
        from budgetbench_core import gate, runlog, tokenizers

        tokenizers.PromptCounter.count = lambda self, messages: 7
        gate.admit = lambda *args, **kwargs: None
        runlog.EventLog.append = lambda self, row: None
        context.audit["patched"] = True
        return context.frame(list(history))


class Trespasser(Truncation):
    """Given the run directory's and the data file's paths (a vendor knows where runs go), tries to
    read answers, forge rows and poison the cache, and to reach the model server directly."""

    name = "hostile-trespasser"

    def __init__(self, run_dir: str = "", data_file: str = "", port: int = 0) -> None:
        super().__init__(run_dir=run_dir, data_file=data_file, port=port)
        self.run_dir, self.data_file, self.port = Path(run_dir), Path(data_file), port

    def tries(self) -> dict[str, str]:
        def forge():
            with open(self.run_dir / "cells" / "forged.jsonl", "a") as handle:
                handle.write('{"event": "result", "quality": 1.0}\n')

        def connect():
            with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                pass

        return {
            "list_run_dir": attempt(lambda: os.listdir(self.run_dir)),
            "forge_row": attempt(forge),
            "read_data_file": attempt(lambda: self.data_file.read_bytes()),
            "connect_model_server": attempt(connect),
            "signal_harness": attempt(lambda: os.kill(os.getppid(), 0)),  # 0: only asks whether it may
        }

    def apply(self, history, budget, context):
        context.audit["tries"] = {
            **self.tries(),
            "read_cache": attempt(lambda: (self.run_dir / "cache.sqlite").read_bytes()),
            "write_scratch": attempt(lambda: (context.scratch_dir / "index.bin").write_bytes(b"mine")),
        }
        return super().apply(history, budget, context)


class EarlyTrespasser(Trespasser):
    """Tries the same while it is created (as import-time code would), with its paths passed so
    that they do not look like paths ('@/...'), and plants a module whose origin is the data
    file, so that a confinement built from the worker's own module list would open its folder."""

    name = "hostile-early-trespasser"

    def __init__(self, run_dir: str = "", data_file: str = "", port: int = 0) -> None:
        super().__init__(run_dir=run_dir.lstrip("@"), data_file=data_file.lstrip("@"), port=port)
        self.early = self.tries()
        planted = types.ModuleType("planted")
        planted.__spec__ = importlib.machinery.ModuleSpec("planted", None, origin=str(self.data_file))
        sys.modules["planted"] = planted

    def apply(self, history, budget, context):
        context.audit["early"] = self.early
        return super().apply(history, budget, context)


class EnvSpy(Truncation):
    """Reports the variables of its worker's environment that hold one of the harness's credentials."""

    name = "hostile-env-spy"

    def apply(self, history, budget, context):
        context.audit["credentials"] = sorted(k for k, v in os.environ.items() if "planted" in v)
        return super().apply(history, budget, context)


class PhaseForger(Truncation):
    """Tells the harness, on its worker's channel, that it is ingesting (a memory system's write
    calls are amortised and not budgeted), then sends its own call far over the budget."""

    name = "hostile-phase-forger"

    def apply(self, history, budget, context):
        import openai

        from budgetbench_core.host import wire

        gc.unfreeze()  # the worker froze its start-up objects, the Host among them
        host = next(o for o in gc.get_objects() if type(o).__name__ == "Host" and hasattr(o, "conn"))
        wire.send(host.conn, {"phase": "ingest"})
        client = openai.OpenAI(max_retries=0, timeout=10)
        long = [{"role": "user", "content": "forged write " * 1500}]
        context.audit["forged"] = attempt(lambda: client.chat.completions.create(model="m", messages=long))
        return super().apply(history, budget, context)


class Exiter(Truncation):
    """Ends its own process on the first item."""

    name = "hostile-exiter"

    def apply(self, history, budget, context):
        if is_first_item(context.item):
            os._exit(3)
        return super().apply(history, budget, context)


class Hanger(Truncation):
    """On its first item, starts a thread that calls the model server later, then never returns."""

    name = "hostile-hanger"

    def __init__(self, port: int = 0) -> None:
        super().__init__(port=port)
        self.port = port

    def apply(self, history, budget, context):
        if is_first_item(context.item):

            def late_call():
                time.sleep(1.5)
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as connection:
                    connection.sendall(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}")

            threading.Thread(target=late_call, daemon=True).start()
            time.sleep(3600)
        return super().apply(history, budget, context)


class Daemonizer(Truncation):
    """Leaves a process behind that escaped its worker's process group and session (``setsid``,
    then its parent exits: a classic daemon), and reports that process's pid."""

    name = "hostile-daemonizer"

    def apply(self, history, budget, context):
        readable, writable = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(writable, str(os.getpid()).encode())
                time.sleep(600)
            os._exit(0)
        os.close(writable)
        context.audit["daemon"] = int(os.read(readable, 32))
        os.close(readable)
        context.audit["daemon_running"] = Path(f"/proc/{context.audit['daemon']}").exists()
        return super().apply(history, budget, context)


class OomProbe(Truncation):
    """Reads, then tries to lower, how readily the kernel kills its process when memory runs out."""

    name = "hostile-oom-probe"

    def apply(self, history, budget, context):
        setting = Path("/proc/self/oom_score_adj")
        context.audit["oom_score_adj"] = setting.read_text().strip()
        context.audit["lower_it"] = attempt(lambda: setting.write_text("-1000"))
        return super().apply(history, budget, context)


class SocketProber(Truncation):
    """Sends a datagram to a loopback UDP port, connects to a Unix socket by its path and opens
    a netlink socket; also connects to the gateway over TCP and runs an event loop (its self-pipe
    is a socketpair), which a plugin may do."""

    name = "hostile-socket-prober"

    def __init__(self, udp_port: int = 0, unix_path: str = "") -> None:
        super().__init__(udp_port=udp_port, unix_path=unix_path)
        self.udp_port, self.unix_path = udp_port, unix_path

    def apply(self, history, budget, context):
        def udp():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.sendto(b"exfiltrated", ("127.0.0.1", self.udp_port))

        def unix():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(self.unix_path)
                sock.sendall(b"exfiltrated")

        def gateway():
            url = urllib.parse.urlsplit(os.environ["OPENAI_BASE_URL"])
            with socket.create_connection((url.hostname, url.port), timeout=5):
                pass

        def event_loop():
            loop = asyncio.new_event_loop()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

        context.audit["tries"] = {
            "udp": attempt(udp),
            "unix_path": attempt(unix),
            "netlink": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close()),
            "tcp_gateway": attempt(gateway),
            "event_loop": attempt(event_loop),
        }
        return super().apply(history, budget, context)


class DeviceProber(Truncation):
    """Run as root, tries what Landlock's paths do not cover: a device node for a disk in its
    scratch folder, the kernel log, another worker's shared memory, its folder's owner; and what
    a plugin's libraries need: multiprocessing's locks (tqdm's), shared memory of its own, the
    harmless devices. Reports its capabilities."""

    name = "hostile-device-prober"

    def apply(self, history, budget, context):
        import multiprocessing
        from multiprocessing import shared_memory

        def own_shared_memory():
            block = shared_memory.SharedMemory(create=True, size=64)
            block.close()
            block.unlink()

        node = context.scratch_dir / "disk"
        context.audit["refused"] = {
            "mknod_in_scratch": attempt(lambda: os.mknod(node, 0o600 | 0o020000, os.makedev(1, 3))),
            "read_kernel_log": attempt(lambda: open("/dev/kmsg", "rb").close()),
            "list_shared_memory": attempt(lambda: os.listdir("/dev/shm")),
            "chown_scratch": attempt(lambda: os.chown(context.scratch_dir, 12345, 12345)),
        }
        context.audit["works"] = {
            "multiprocessing_lock": attempt(lambda: multiprocessing.get_context("spawn").Lock()),
            "own_shared_memory": attempt(own_shared_memory),
            "urandom": attempt(lambda: open("/dev/urandom", "rb").read(8)),
            "dev_null": attempt(lambda: open("/dev/null", "w").write("x")),
        }
        status = Path("/proc/self/status").read_text()
        context.audit["capabilities"] = next(line.split()[1] for line in status.splitlines() if line[:7] == "CapEff:")
        return super().apply(history, budget, context)


class OwnSdk(Truncation):
    """A vendor layer with its own OpenAI client (configured from the environment, as SDKs are),
    which also leaves a thread behind that calls again after ``apply`` returned."""

    name = "metered-own-sdk"

    def apply(self, history, budget, context):
        import openai

        client = openai.OpenAI(max_retries=0, timeout=10)  # OPENAI_BASE_URL and OPENAI_API_KEY
        note = f"Summarise: {history[-1].content[:300]}"
        reply = client.chat.completions.create(
            model="vendor-llm", messages=[{"role": "user", "content": note}], max_tokens=8
        )
        context.audit["note"] = note
        context.audit["reply"] = reply.choices[0].message.content

        def late_call():
            time.sleep(0.5)
            try:
                client.chat.completions.create(model="vendor-llm", messages=[{"role": "user", "content": "late"}])
            except Exception:  # noqa: BLE001 - refused, as it should be
                pass

        threading.Thread(target=late_call, daemon=True).start()
        return super().apply(history, budget, context)


class Declares(Truncation):
    """Declares the folders it reads (``read_paths``): a model folder may be read, the rest is not."""

    name = "declares-reads"

    def __init__(self, folder: str = "", other: str = "") -> None:
        super().__init__(folder=folder, other=other)
        self.folder, self.other = folder, other

    def read_paths(self):
        return [self.folder]

    def apply(self, history, budget, context):
        context.audit["tries"] = {
            "declared": attempt(lambda: (Path(self.folder) / "weights.bin").read_bytes()),
            "undeclared": attempt(lambda: Path(self.other).read_bytes()),
        }
        return super().apply(history, budget, context)


PLUGIN = types.SimpleNamespace(
    register_strategies=hookimpl(
        lambda register: [
            register(cls)
            for cls in (
                GcSpy,
                Patcher,
                Trespasser,
                EarlyTrespasser,
                EnvSpy,
                PhaseForger,
                Exiter,
                Hanger,
                Daemonizer,
                OomProbe,
                SocketProber,
                DeviceProber,
                OwnSdk,
                Declares,
            )
        ]
    )
)


def hostile_run(tmp_path: Path, strategy: str, params=None, **options):
    out = tmp_path / "run"
    counter = PromptCounter(tokenizer_for("tiktoken:cl100k_base"))
    served = lambda messages: counter.count([Message(m["role"], m["content"]) for m in messages])  # noqa: E731
    with FaultServer(reply=gold_reply, count_prompt=served) as server:
        params = {k: (server.port if v == "PORT" else v) for k, v in (params or {}).items()}
        settings = dict(
            task="synthetic-memory",
            strategies=["truncation", strategy],
            budgets=[300],
            out=out,
            api_base=server.url,
            model="openai/fault-model",
            tokenizer="tiktoken:cl100k_base",
            task_options=TASK_OPTIONS,
            strategy_params={strategy: params},
            max_concurrency=1,
            retries=0,
            timeout_s=30.0,
        )
        settings.update(options)
        summary = run(RunConfig(**settings), registry=registry_with(PLUGIN, distribution="hostile-vendor"))
        time.sleep(2.0)  # whatever a killed worker had scheduled would have reached the server by now
        hits = list(server.hits)
    rows = {k[1:]: v for k, v in final_rows(out).items()}
    audits = {
        (e["strategy"], e["item_id"]): e.get("strategy_audit", {})
        for e in iter_events(out)
        if e["event"] == "prompt_audit"
    }
    return out, summary, rows, audits, hits


def by_strategy(rows, strategy):
    return {key[-1]: row for key, row in rows.items() if key[0] == strategy}


def test_a_strategy_searching_memory_and_frames_finds_no_answer(tmp_path):
    """Old code (in-process): the spy found every item's answer and scored 1.0 where truncation scored 0."""
    out, _, rows, audits, _ = hostile_run(tmp_path, "hostile-gc-spy")
    spy, twin = by_strategy(rows, "hostile-gc-spy"), by_strategy(rows, "truncation")
    assert len(spy) == len(twin) == TASK_OPTIONS["items"]
    spied = [audit for (name, _), audit in audits.items() if name == "hostile-gc-spy"]
    assert all(audit["found"] == [] and audit["pid"] != os.getpid() for audit in spied)
    assert {i: r["quality"] for i, r in spy.items()} == {i: r["quality"] for i, r in twin.items()}
    assert verify_run(out).ok


def test_patching_the_counter_gate_and_log_in_the_worker_changes_nothing_recorded(tmp_path):
    """Old code: the patched counter said 7 tokens and the gate admitted a 600-token prompt."""
    out, _, rows, audits, _ = hostile_run(tmp_path, "hostile-patcher")
    patched = by_strategy(rows, "hostile-patcher")
    assert all(audit.get("patched") for (name, _), audit in audits.items() if name == "hostile-patcher")
    assert patched and all(r["event"] == "violation" and r["prompt_tokens"] > 300 for r in patched.values())
    honest = by_strategy(rows, "truncation")
    assert all(r["event"] == "result" and r["prompt_tokens"] <= 300 for r in honest.values())
    assert verify_run(out).ok


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock ABI 4 (Linux 6.7+) for file and TCP rules")
def test_a_confined_worker_reaches_neither_the_run_directory_nor_the_data_nor_the_server(tmp_path):
    """Old code: the strategy read the cache and other rows, forged rows and could call any server."""
    data = tmp_path / "answers.json"
    data.write_text('{"answer": "secret"}')
    params = {"run_dir": str(tmp_path / "run"), "data_file": str(data), "port": "PORT"}
    out, summary, rows, audits, hits = hostile_run(tmp_path, "hostile-trespasser", params)
    tries = [audit["tries"] for (name, _), audit in audits.items() if name == "hostile-trespasser"]
    assert len(tries) == TASK_OPTIONS["items"]
    for tried in tries:
        assert tried.pop("write_scratch") == "reached"  # its own folder is its to use
        assert tried.pop("signal_harness") == ("PermissionError" if SCOPES else "reached")
        assert set(tried.values()) == {"PermissionError"}, tried
    assert not (out / "cells" / "forged.jsonl").exists()
    assert len(hits) == summary.model_calls  # the harness's calls, none of the strategy's
    assert verify_run(out).ok
    from budgetbench_core.runlog import read_manifest

    isolation = read_manifest(out)["identity"]["isolation"]
    assert isolation["isolation"] == "process" and isolation["sandbox"] == f"landlock-abi-{abi_version()}"


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock ABI 4 (Linux 6.7+) for file and TCP rules")
def test_a_worker_is_confined_before_its_plugin_runs_and_nothing_it_plants_widens_that(tmp_path):
    """Old code: the worker was confined after its plugin was created, by a list of its own loaded
    modules: the constructor listed the run directory, read the data file and reached the model
    server, and the planted module opened the data's folder (the run directory too) to apply."""
    data = tmp_path / "answers.json"
    data.write_text('{"answer": "secret"}')
    params = {"run_dir": f"@{tmp_path / 'run'}", "data_file": f"@{data}", "port": "PORT"}
    out, summary, rows, audits, hits = hostile_run(tmp_path, "hostile-early-trespasser", params)
    audited = [audit for (name, _), audit in audits.items() if name == "hostile-early-trespasser"]
    assert len(audited) == TASK_OPTIONS["items"]
    for audit in audited:
        for tried in (audit["early"], audit["tries"]):
            assert tried.pop("signal_harness") == ("PermissionError" if SCOPES else "reached")
        # created for the manifest's description, before the run directory has its cells/ folder
        assert audit["early"].pop("forge_row") in ("PermissionError", "FileNotFoundError")
        assert set(audit["early"].values()) == {"PermissionError"}, audit["early"]
        assert audit["tries"].pop("write_scratch") == "reached"
        assert set(audit["tries"].values()) == {"PermissionError"}, audit["tries"]
    assert not (out / "cells" / "forged.jsonl").exists()
    assert len(hits) == summary.model_calls  # the harness's calls, none of the strategy's
    assert verify_run(out).ok


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock ABI 4 (Linux 6.7+) for file and TCP rules")
def test_a_worker_holds_no_capability_and_reaches_no_device_but_the_harmless_ones(tmp_path):
    """Old code, run as root (containers, CI): the worker kept every capability and all of /dev,
    so it made a device node in its scratch folder (a disk's would read the data's raw blocks),
    read the kernel log, listed other workers' shared memory and changed its folder's owner."""
    out, summary, rows, audits, hits = hostile_run(tmp_path, "hostile-device-prober")
    audited = [audit for (name, _), audit in audits.items() if name == "hostile-device-prober"]
    assert len(audited) == TASK_OPTIONS["items"]
    for audit in audited:
        refused = {
            k: v for k, v in audit["refused"].items() if not (k == "read_kernel_log" and v == "FileNotFoundError")
        }
        assert set(refused.values()) == {"PermissionError"}, audit["refused"]
        assert set(audit["works"].values()) == {"reached"}, audit["works"]
        assert int(audit["capabilities"], 16) == 0
    assert [row["event"] for row in by_strategy(rows, "hostile-device-prober").values()] == ["result"] * 4
    assert verify_run(out).ok


def test_no_credential_of_the_harness_reaches_a_worker(tmp_path, monkeypatch):
    """Old code: ``HF_TOKEN`` passed with the other ``HF_`` switches."""
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "LC_SECRET", "TORCH_PASSWORD"):
        monkeypatch.setenv(name, f"planted-credential-{name.lower()}")
    _, _, _, audits, _ = hostile_run(tmp_path, "hostile-env-spy")
    spied = [audit["credentials"] for (name, _), audit in audits.items() if name == "hostile-env-spy"]
    assert spied == [[]] * TASK_OPTIONS["items"]


def test_a_phase_the_worker_claims_is_refused_ends_it_and_fails_the_cell(tmp_path):
    """The harness, not the worker, says which phase a plugin is in (it sends a memory system
    ``ingest`` and ``retrieve`` itself). Old code: every tier's forged call was charged as an
    unbudgeted write (one per item as the first apply of an item)."""
    out, _, rows, _, _ = hostile_run(tmp_path, "hostile-phase-forger", budgets=[300, 2000])
    forger = [r for r in rows.values() if r["strategy"] == "hostile-phase-forger"]
    assert len(forger) == 2 * TASK_OPTIONS["items"]
    assert all(r["event"] == "error" for r in forger)
    assert all("hostile-phase-forger" in r["cause"] and "not a request" in r["cause"] for r in forger)
    assert not any(r.get("metered", {}).get("write") for r in forger)
    assert verify_run(out).ok


def test_a_strategy_that_exits_its_process_is_an_error_row_naming_it_and_the_run_goes_on(tmp_path):
    out, _, rows, _, _ = hostile_run(tmp_path, "hostile-exiter")
    exiter = by_strategy(rows, "hostile-exiter")
    errors = [r for r in exiter.values() if r["event"] == "error"]
    assert len(errors) == 1 and "hostile-exiter" in errors[0]["cause"] and "exit code 3" in errors[0]["cause"]
    assert sum(r["event"] == "result" for r in exiter.values()) == TASK_OPTIONS["items"] - 1  # a new worker
    assert verify_run(out).ok


def test_a_strategy_past_its_deadline_is_killed_with_everything_it_started(tmp_path):
    """Old code: the hung thread was only discarded; what it had started went on running."""
    out, summary, rows, _, hits = hostile_run(tmp_path, "hostile-hanger", {"port": "PORT"}, item_timeout_s=2.0)
    hanger = by_strategy(rows, "hostile-hanger")
    (error,) = [r for r in hanger.values() if r["event"] == "error"]
    assert "hostile-hanger" in error["cause"] and "did not return within 2 s" in error["cause"]
    assert sum(r["event"] == "result" for r in hanger.values()) == TASK_OPTIONS["items"] - 1
    assert len(hits) == summary.model_calls  # the late call never reached the server
    assert verify_run(out).ok


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a worker's guard is a Linux child subreaper")
def test_a_process_that_escaped_its_workers_session_ends_with_the_worker(tmp_path):
    """Old code: killing the worker's process group missed a daemon that had left it (setsid):
    it outlived the run."""
    out, _, rows, audits, _ = hostile_run(tmp_path, "hostile-daemonizer", budgets=[300, 2000])
    daemons = [audit for (name, _), audit in audits.items() if name == "hostile-daemonizer"]
    assert len(daemons) == TASK_OPTIONS["items"] and all(d["daemon_running"] for d in daemons)
    left = [d["daemon"] for d in daemons if _running(d["daemon"])]
    assert left == []
    assert by_strategy(rows, "hostile-daemonizer").keys() == by_strategy(rows, "truncation").keys()
    assert verify_run(out).ok


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock: /proc/self read-only to the worker")
def test_a_worker_is_the_first_process_killed_when_memory_runs_out_and_cannot_change_that(tmp_path):
    """Old code: a plugin exhausting memory left the choice to the kernel (the harness, holding
    the run, could be the one killed)."""
    _, _, _, audits, _ = hostile_run(tmp_path, "hostile-oom-probe")
    probed = [audit for (name, _), audit in audits.items() if name == "hostile-oom-probe"]
    assert probed == [{"oom_score_adj": "1000", "lower_it": "PermissionError"}] * TASK_OPTIONS["items"]


@pytest.mark.skipif(
    not SOCKET_FILTER, reason=f"needs Landlock ABI 4 (Linux 6.7+) on x86_64 or aarch64, not {platform.machine()}"
)
def test_a_worker_opens_no_udp_unix_path_or_netlink_socket_but_still_tcp_and_event_loops(tmp_path):
    """Old code: the datagram and the Unix connection reached the test's listeners (Landlock
    does not mediate them: tmp_path is not even readable by the worker), netlink opened."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_path = tmp_path / "u.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(unix_path))
    unix.listen()
    with udp, unix:
        params = {"udp_port": udp.getsockname()[1], "unix_path": str(unix_path)}
        out, _, rows, audits, _ = hostile_run(tmp_path, "hostile-socket-prober", params)
        assert _received_nothing(udp) and _received_nothing(unix)  # hostile_run waited 2 s after the run
    tried = [audit["tries"] for (name, _), audit in audits.items() if name == "hostile-socket-prober"]
    assert (
        tried
        == [
            {
                "udp": "PermissionError",
                "unix_path": "PermissionError",
                "netlink": "PermissionError",
                "tcp_gateway": "reached",
                "event_loop": "reached",
            }
        ]
        * TASK_OPTIONS["items"]
    )
    prober, twin = by_strategy(rows, "hostile-socket-prober"), by_strategy(rows, "truncation")
    assert len(prober) == len(twin) == TASK_OPTIONS["items"]
    assert {i: r["quality"] for i, r in prober.items()} == {i: r["quality"] for i, r in twin.items()}
    assert verify_run(out).ok


def _received_nothing(listener: socket.socket) -> bool:
    """Whether no datagram reached, or no connection waits on, ``listener``."""
    listener.setblocking(False)
    try:
        listener.recv(64) if listener.type == socket.SOCK_DGRAM else listener.accept()
    except BlockingIOError:
        return True
    return False


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_isolation_none_runs_in_process_and_says_so(tmp_path):
    """The debugging mode: the strategy runs in the harness's own process, where the spy finds the
    answers (why a result needs isolation), and the run records it."""
    out, _, rows, audits, _ = hostile_run(tmp_path, "hostile-gc-spy", isolation="none")
    assert all(audit["found"] for (name, _), audit in audits.items() if name == "hostile-gc-spy")
    assert {audit["pid"] for (name, _), audit in audits.items() if name == "hostile-gc-spy"} == {os.getpid()}
    from budgetbench_core.runlog import read_manifest

    assert read_manifest(out)["identity"]["isolation"] == {"isolation": "none", "sandbox": "none"}


def test_a_plugins_own_sdk_calls_are_metered_per_cell_and_cut_off_after_apply(tmp_path):
    """Old code: a vendor SDK's calls went straight to its endpoint and appeared nowhere.

    Each apply makes one call and leaves a thread that calls again 0.5 s later: that call is
    metered against whichever cell of the worker is running then, or refused (and recorded)
    when none is; it never reaches the server unmetered."""
    counter = PromptCounter(tokenizer_for("tiktoken:cl100k_base"))
    out, summary, rows, audits, hits = hostile_run(tmp_path, "metered-own-sdk")
    metered = [e for e in iter_events(out) if e["event"] == "metered_call"]
    late = out / "late_calls.jsonl"
    refused = late.read_text().count("refused by the metering gateway") if late.exists() else 0
    # each apply's own call, plus the late calls that found the worker in a cell (the others were
    # refused and recorded, or never sent: the worker was killed at the end of the run)
    assert TASK_OPTIONS["items"] <= len(metered) and len(metered) + refused <= 2 * TASK_OPTIONS["items"]
    assert all(c["strategy"] == "metered-own-sdk" and c["phase"] == "aux" and c["ok"] for c in metered)
    terminal = by_strategy(rows, "metered-own-sdk")
    for item_id, row in terminal.items():
        own = [c for c in metered if c["item_id"] == item_id]
        note = audits[("metered-own-sdk", item_id)]["note"]
        assert counter.count([Message("user", note)]) in [c["input_tokens"] for c in own]
        assert all(c["input_tokens"] == c["served_prompt_tokens"] for c in own)  # the server's count agrees
        assert row["metered"]["aux"]["calls"] == len(own)
        assert row["metered"]["aux"]["input_tokens"] == sum(c["input_tokens"] for c in own)
        assert row["metered"]["aux"]["completion_tokens"] == sum(c["completion_tokens"] for c in own)
    # every request the server saw is one the harness made or metered: answers of both arms + metered
    assert sum(1 for _, path in hits if path.endswith("/chat/completions")) == summary.model_calls
    answered = sum(1 for r in rows.values() if r["event"] == "result" and not r["cached"])
    # each apply's own call (a note of its item) reached the server; a repeated late call may be a
    # reply-cache hit (gateway calls go through the run's cache), so it need not
    assert answered + TASK_OPTIONS["items"] <= summary.model_calls <= answered + len(metered)
    assert verify_run(out).ok


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock")
def test_a_declared_model_folder_is_readable_and_a_declared_evidence_path_is_refused(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "weights.bin").write_bytes(b"w" * 64)
    other = tmp_path / "elsewhere.txt"
    other.write_text("not declared")
    out, _, rows, audits, _ = hostile_run(tmp_path, "declares-reads", {"folder": str(models), "other": str(other)})
    tries = [a["tries"] for (name, _), a in audits.items() if name == "declares-reads"]
    assert tries and all(t == {"declared": "reached", "undeclared": "PermissionError"} for t in tries)
    from budgetbench_core.runlog import read_manifest

    assert read_manifest(out)["read_paths"] == {"declares-reads": [str(models.resolve())]}
    # declaring the run directory itself (where the rows and the cache are) is refused before any cell
    with pytest.raises(Exception, match="declares it reads .*refused"):
        hostile_run(tmp_path / "again", "declares-reads", {"folder": str(tmp_path / "again"), "other": str(other)})
