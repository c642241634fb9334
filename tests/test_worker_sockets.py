"""A confined worker opens no socket but TCP's (``host/seccomp.py``): Landlock limits TCP ports,
but not UDP, Unix sockets named by a path, netlink or io_uring.

A hostile strategy tries each on listeners of the test's own and records what happened in its
audit; it is run beside its honest twin (truncation), as in ``test_isolation.py``: it must
score what the twin scores, and the run directory must still verify.
"""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import time
import types
import urllib.parse
from importlib import metadata
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, hookimpl, run
from budgetbench_core.builtin.strategies import Truncation
from budgetbench_core.host import seccomp
from budgetbench_core.host.landlock import abi_version
from budgetbench_core.integrity import verify_run
from budgetbench_core.messages import Message
from budgetbench_core.plugin_index import _build_index
from budgetbench_core.runlog import final_rows, iter_events
from budgetbench_core.testing import FaultServer, registry_with, tokenizer_for
from budgetbench_core.tokenizers import PromptCounter

TASK_OPTIONS = {"items": 2, "history_tokens": 600}
CONFINED = abi_version() >= 4 and seccomp.supported()  # workers are confined, and the filter applies here
needs_confinement = pytest.mark.skipif(
    not CONFINED, reason=f"needs Landlock ABI 4 (Linux 6.7+) on x86_64 or aarch64, not {platform.machine()}"
)


def attempt(action) -> str:
    """What happened when the strategy tried ``action``: 'reached' or the error it got."""
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - a refusal of any kind is what we want to see
        return type(exc).__name__
    return "reached"


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


PLUGIN = types.SimpleNamespace(register_strategies=hookimpl(lambda register: register(SocketProber)))


def prober_run(tmp_path: Path, params: dict):
    out = tmp_path / "run"
    counter = PromptCounter(tokenizer_for("tiktoken:cl100k_base"))
    served = lambda messages: counter.count([Message(m["role"], m["content"]) for m in messages])  # noqa: E731
    with FaultServer(count_prompt=served) as server:
        config = RunConfig(
            task="synthetic-memory",
            strategies=["truncation", SocketProber.name],
            budgets=[300],
            out=out,
            api_base=server.url,
            model="openai/fault-model",
            tokenizer="tiktoken:cl100k_base",
            task_options=TASK_OPTIONS,
            strategy_params={SocketProber.name: params},
            max_concurrency=1,
            retries=0,
            timeout_s=30.0,
        )
        run(config, registry=registry_with(PLUGIN, distribution="hostile-vendor"))
    rows = {k[1:]: v for k, v in final_rows(out).items()}
    audits = [
        e.get("strategy_audit", {})
        for e in iter_events(out)
        if e["event"] == "prompt_audit" and e["strategy"] == SocketProber.name
    ]
    return out, rows, audits


def by_strategy(rows, strategy):
    return {key[-1]: row for key, row in rows.items() if key[0] == strategy}


def received_nothing(listener: socket.socket) -> bool:
    """Whether no datagram reached, or no connection waits on, ``listener``."""
    listener.setblocking(False)
    try:
        listener.recv(64) if listener.type == socket.SOCK_DGRAM else listener.accept()
    except BlockingIOError:
        return True
    return False


@needs_confinement
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
        out, rows, audits = prober_run(tmp_path, params)
        time.sleep(0.2)  # a datagram sent as the run ended has arrived by now
        assert received_nothing(udp) and received_nothing(unix)
    assert len(audits) == TASK_OPTIONS["items"]
    for audit in audits:
        assert audit["tries"] == {
            "udp": "PermissionError",
            "unix_path": "PermissionError",
            "netlink": "PermissionError",
            "tcp_gateway": "reached",
            "event_loop": "reached",
        }
    prober, twin = by_strategy(rows, SocketProber.name), by_strategy(rows, "truncation")
    assert len(prober) == len(twin) == TASK_OPTIONS["items"]
    assert {i: r["quality"] for i, r in prober.items()} == {i: r["quality"] for i, r in twin.items()}
    assert verify_run(out).ok


@pytest.mark.skipif(abi_version() < 1 or not seccomp.supported(), reason="needs Landlock on x86_64 or aarch64")
def test_the_plugin_index_records_its_socket_filter():
    builtin = [ep for ep in metadata.entry_points(group="budgetbench") if ep.name == "builtin-strategies"]
    sandbox = _build_index(builtin)["sandbox"]
    assert sandbox["sandbox"] == f"landlock-abi-{abi_version()}"
    assert sandbox["sockets"] == seccomp.SUMMARY
