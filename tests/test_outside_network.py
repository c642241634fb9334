"""Outside services: a plugin worker reaches a host that is not the gateway only through the
harness's proxy, which lets a declared host through (metered per cell: calls and bytes by host)
and refuses and records any other.

The "outside" services are loopback servers on 127.0.0.2 (not in the worker's ``NO_PROXY``),
each counting the bytes it received and sent, so the proxy's figures can be checked against
what the far end saw.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import socketserver
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from budgetbench_core import Message, RunConfig, hookimpl, run
from budgetbench_core.builtin.strategies import Truncation
from budgetbench_core.host.landlock import abi_version
from budgetbench_core.host.proxy import NetworkDeclarationError, parse_hosts
from budgetbench_core.integrity import verify_run
from budgetbench_core.report import write_report
from budgetbench_core.report.ledger import ledger_markdown
from budgetbench_core.runlog import final_rows, iter_events, read_manifest
from budgetbench_core.testing import FaultServer, registry_with, tokenizer_for
from budgetbench_core.tokenizers import PromptCounter

ITEMS = 3
LANDLOCK = abi_version() >= 4
OUTSIDE = "127.0.0.2"


class CountingServer:
    """A tiny HTTP server on ``OUTSIDE`` that answers every request with ``payload`` and counts bytes."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.received = self.sent = self.connections = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = self.request.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                reply = (
                    f"HTTP/1.1 200 OK\r\nContent-Length: {len(outer.payload)}\r\nConnection: close\r\n\r\n".encode()
                    + outer.payload
                )
                self.request.sendall(reply)
                with outer.lock:
                    outer.connections += 1
                    outer.received += len(data)
                    outer.sent += len(reply)

        self.server = socketserver.ThreadingTCPServer((OUTSIDE, 0), Handler)
        self.port = self.server.server_address[1]

    def __enter__(self) -> CountingServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def outcome(action) -> str:
    try:
        return action()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except Exception as exc:  # noqa: BLE001 - what the plugin got is what the test checks
        return type(exc).__name__


class HostedMemory(Truncation):
    """A vendor layer with a hosted API: it declares ``declared`` and also tries ``undeclared``,
    over plain HTTP (urllib, from the proxy environment), over a CONNECT tunnel, and directly."""

    name = "hosted-memory"

    def __init__(self, declared: str = "", undeclared: str = "") -> None:
        super().__init__(declared=declared, undeclared=undeclared)
        self.declared, self.undeclared = declared, undeclared

    def network_hosts(self):
        return [self.declared]

    def apply(self, history, budget, context):
        def get(target):
            return lambda: urllib.request.urlopen(f"http://{target}/memories?q=1", timeout=10).read().decode()

        def tunnel():  # what an HTTPS client does: CONNECT, then its bytes through the tunnel
            proxy = urllib.request.getproxies()["https"].split("@")[1]
            token = os.environ["HTTPS_PROXY"].split("@")[0].rsplit(":", 1)[1]
            import base64

            auth = base64.b64encode(f"budgetbench:{token}".encode()).decode()
            host, port = proxy.split(":")
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            target_host, target_port = self.declared.split(":")
            connection.set_tunnel(target_host, int(target_port), headers={"Proxy-Authorization": f"Basic {auth}"})
            connection.request("GET", "/tunnelled")
            return connection.getresponse().read().decode()

        def direct():
            host, port = self.undeclared.split(":")
            socket.create_connection((host, int(port)), timeout=5).close()
            return "reached"

        context.audit["tries"] = {
            "declared": outcome(get(self.declared)),
            "tunnel": outcome(tunnel),
            "undeclared": outcome(get(self.undeclared)),
            "direct": outcome(direct),
        }
        return super().apply(history, budget, context)


class LeavesACallBehind(HostedMemory):
    """Calls its declared host from a thread that outlives ``apply`` (as an SDK's flusher might)."""

    name = "hosted-late"

    def apply(self, history, budget, context):
        def later():
            time.sleep(0.5)
            outcome(lambda: urllib.request.urlopen(f"http://{self.declared}/late", timeout=5).read())

        threading.Thread(target=later, daemon=True).start()
        return Truncation.apply(self, history, budget, context)


PLUGIN = types.SimpleNamespace(
    register_strategies=hookimpl(lambda register: [register(HostedMemory), register(LeavesACallBehind)])
)


def test_a_declared_host_is_metered_and_an_undeclared_one_is_refused_and_recorded(tmp_path: Path):
    """Old code: the worker had no proxy; a declared outside service was unreachable under Landlock
    (and reachable unmetered without it), and an undeclared attempt was recorded nowhere."""
    out = tmp_path / "run"
    counter = PromptCounter(tokenizer_for("tiktoken:cl100k_base"))
    served = lambda messages: counter.count([Message(m["role"], m["content"]) for m in messages])  # noqa: E731
    with (
        CountingServer(b"memory: the dog is called Rex") as vendor,
        CountingServer(b"exfiltrated") as rogue,
        FaultServer(count_prompt=served) as model,
    ):
        declared, undeclared = f"{OUTSIDE}:{vendor.port}", f"{OUTSIDE}:{rogue.port}"
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["hosted-memory"],
                budgets=[300],
                out=out,
                api_base=model.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": ITEMS, "history_tokens": 600},
                strategy_params={"hosted-memory": {"declared": declared, "undeclared": undeclared}},
                max_concurrency=1,
                retries=0,
                timeout_s=30.0,
            ),
            registry=registry_with(PLUGIN, distribution="hosted-vendor"),
        )
    tries = [e["strategy_audit"]["tries"] for e in iter_events(out) if e["event"] == "prompt_audit"]
    assert len(tries) == ITEMS
    for tried in tries:
        assert tried["declared"] == tried["tunnel"] == "memory: the dog is called Rex"
        assert tried["undeclared"] == "HTTP 403"
        if LANDLOCK:
            assert tried["direct"] == "PermissionError"  # around the proxy: Landlock allows its port only
    assert rogue.connections == 0 if LANDLOCK else rogue.connections <= ITEMS  # never through the proxy
    assert vendor.connections == 2 * ITEMS
    rows = list(final_rows(out).values())
    assert len(rows) == ITEMS and all(r["event"] == "result" for r in rows)
    sent = received = 0
    for row in rows:
        outside = row["metered"]["outside"]
        assert outside["calls"] == 2 and set(outside["hosts"]) == {declared}
        assert row["metered"]["undeclared"] == {"calls": 1, "hosts": {undeclared: 1}}
        sent, received = sent + outside["bytes_sent"], received + outside["bytes_received"]
    assert (sent, received) == (vendor.received, vendor.sent)  # exactly what the far end saw
    late = (out / "late_calls.jsonl").read_text()
    assert late.count("undeclared network use") == ITEMS and undeclared in late and "hosted-memory" in late
    assert verify_run(out).ok
    paths = write_report(out)
    (row,) = json.loads(paths["json"].read_text())["ledger"]
    assert row["outside_calls"] == 2 * ITEMS and row["outside_bytes"] == vendor.received + vendor.sent
    assert row["undeclared_network"] == {undeclared: ITEMS}
    markdown = "\n".join(ledger_markdown([row], None))
    assert f"| {undeclared} | {ITEMS} | — | **undeclared network use: refused** |" in markdown
    assert read_manifest(out)["identity"]["isolation"]["isolation"] == "process"


def test_network_hosts_must_be_host_or_host_and_port():
    assert parse_hosts(["API.vendor.com", "mem.example:443", "api.vendor.com"], "x") == [
        "api.vendor.com",
        "mem.example:443",
    ]
    for bad in (["https://api.vendor.com"], ["api.vendor.com/v1"], ["host:port"], "api.vendor.com", [3]):
        with pytest.raises(NetworkDeclarationError, match="network_hosts()"):
            parse_hosts(bad, "strategy 'x'")


def test_declaring_a_loopback_host_that_names_the_harness_is_refused_before_any_cell(tmp_path: Path):
    """'localhost' (any port) would let the worker reach the gateway's and the proxy's ports, and
    the model server, through the proxy: refused, naming the strategy, before any cell runs."""
    with FaultServer() as model, pytest.raises(Exception, match="'hosted-memory' declares it reaches localhost"):
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["hosted-memory"],
                budgets=[300],
                out=tmp_path / "run",
                api_base=model.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": 1, "history_tokens": 600},
                strategy_params={"hosted-memory": {"declared": "localhost", "undeclared": "127.0.0.2:9"}},
                max_concurrency=1,
                retries=0,
            ),
            registry=registry_with(PLUGIN, distribution="hosted-vendor"),
        )
    assert not list((tmp_path / "run").glob("cells/**/*.jsonl"))


def test_a_declared_host_is_refused_outside_apply_and_recorded(tmp_path: Path):
    """A thread the plugin left running calls its declared host after ``apply`` returned (while the
    answer call is still out): refused, never reaching the host, and in ``late_calls.jsonl``."""
    out = tmp_path / "run"
    with CountingServer(b"late") as vendor, FaultServer(latency_s=3.0) as model:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["hosted-late"],
                budgets=[300],
                out=out,
                api_base=model.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": 1, "history_tokens": 600},
                strategy_params={"hosted-late": {"declared": f"{OUTSIDE}:{vendor.port}"}},
                max_concurrency=1,
                retries=0,
                timeout_s=30.0,
            ),
            registry=registry_with(PLUGIN, distribution="hosted-vendor"),
        )
    assert vendor.connections == 0
    (row,) = final_rows(out).values()
    assert row["event"] == "result" and "outside" not in row["metered"]
    late = (out / "late_calls.jsonl").read_text()
    assert "declared host outside apply" in late and f"{OUTSIDE}:{vendor.port}" in late
