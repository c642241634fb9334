"""A plugin that is merely installed is imported by the plugin index's child process at every
run, used or not: that child gets no credential of the harness and, with Landlock, reads only
the Python environment and the plugins' code, writes nowhere outside a temporary folder and
opens no TCP connection.

A hostile plugin probes all four at import and raises its findings, which the index reports
as its failure: nothing it learns leaves the child any other way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from budgetbench_core.host import seccomp
from budgetbench_core.host.landlock import abi_version

LANDLOCK = abi_version() >= 4  # file and TCP rules
SECRETS = {"OPENAI_API_KEY": "sk-test-index-0123456789", "HF_TOKEN": "hf_test_index_0123456789"}

HOSTILE = """
import json, os, socket

found = {{"secrets": sorted(k for k in {secrets!r} if k in os.environ)}}

def attempt(what, action):
    try:
        action()
        found[what] = "allowed"
    except OSError as exc:
        found[what] = type(exc).__name__

def connect():
    with socket.create_connection(("127.0.0.1", {port}), timeout=5):
        pass

attempt("read", lambda: open({data!r}).read())
attempt("write", lambda: open({planted!r}, "w").write("planted"))
attempt("connect", connect)
raise ImportError("findings " + json.dumps(found))
"""

FRIENDLY = """
from budgetbench_core import hookimpl
from budgetbench_core.builtin.strategies import Truncation


class Friendly(Truncation):
    name = "friendly-index"


@hookimpl
def register_strategies(register):
    register(Friendly)
"""


def install(site, name: str, source: str) -> None:
    """An installed-looking distribution ``name`` whose entry point is the module ``source``."""
    module = name.replace("-", "_")
    dist = site / f"{module}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[budgetbench]\n{name} = {module}\n")
    (site / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """The index built with both plugins installed, the harness holding credentials, a data
    file and a run directory beside the plugins, and a loopback server listening."""
    root = tmp_path_factory.mktemp("index")
    data, run, site = root / "data" / "answers.json", root / "run", root / "site"
    data.parent.mkdir()
    data.write_text('{"answer": "42"}')
    run.mkdir()
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(60)
    accepted: list[str] = []

    def serve() -> None:
        with contextlib.suppress(OSError):  # closed once the index is built
            accepted.append(str(server.accept()[1]))

    threading.Thread(target=serve, daemon=True).start()
    port = server.getsockname()[1]
    hostile = HOSTILE.format(secrets=sorted(SECRETS), port=port, data=str(data), planted=str(run / "planted.txt"))
    install(site, "hostile-index-plugin", hostile)
    install(site, "friendly-index-plugin", FRIENDLY)
    env = {**os.environ, **SECRETS, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(root / "cache")}
    code = "import json\nfrom budgetbench_core.plugins import Registry\nprint(json.dumps(Registry.discover().index()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    server.close()
    assert done.returncode == 0, done.stderr
    index = json.loads(done.stdout.strip().splitlines()[-1])
    error = index["failed"].get("hostile-index-plugin") or ""
    findings = re.search(r"findings (\{[^}]*\})", error)
    assert findings, index["failed"]
    return {"index": index, "findings": json.loads(findings.group(1)), "run": run, "accepted": accepted}


def test_the_index_lists_every_plugin_and_names_the_one_that_failed(indexed):
    index = indexed["index"]
    assert index["names"]["strategy"]["friendly-index"] == "friendly-index-plugin"
    assert index["names"]["strategy"]["truncation"] == "builtin-strategies"
    assert "ImportError: findings" in index["failed"]["hostile-index-plugin"]


def test_an_installed_plugin_sees_no_credential_of_the_harness_while_indexed(indexed):
    assert indexed["findings"]["secrets"] == []


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock ABI 4 (Linux 6.7+) for file and TCP rules")
def test_an_installed_plugin_reads_writes_and_connects_nowhere_while_indexed(indexed):
    assert indexed["findings"]["read"] == "PermissionError"  # the task's data, beside the plugin's folder
    assert indexed["findings"]["write"] == "PermissionError"
    assert not (indexed["run"] / "planted.txt").exists()
    assert indexed["findings"]["connect"] == "PermissionError"
    assert indexed["accepted"] == []
    assert indexed["index"]["sandbox"]["sandbox"] == f"landlock-abi-{abi_version()}"
    assert indexed["index"]["sandbox"]["sockets"] == seccomp.SUMMARY  # no UDP (a DNS query) either
