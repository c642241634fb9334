"""The outside proxy's cost to the harness: main-process CPU per request a worker sends through it.

The proxy runs here (as in a run); a child process plays the worker and the outside service
(a loopback HTTP server on 127.0.0.2), sending ``--requests`` GETs through the proxy, plain
HTTP and CONNECT tunnels alternately, each on a new connection (what a client without
keep-alive does: the proxy's worst case). The harness's CPU is this process's
``time.process_time`` over the child's requests, so the child's own work is not in it.

    .venv/bin/python benchmarks/bench_proxy.py --requests 2000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from budgetbench_core.host.proxy import OutsideProxy

CHILD = r"""
import base64, http.client, socketserver, sys, threading
token, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
class H(socketserver.BaseRequestHandler):
    def handle(self):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(65536)
            if not chunk: return
            data += chunk
        self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
server = socketserver.ThreadingTCPServer(("127.0.0.2", 0), H)
threading.Thread(target=server.serve_forever, daemon=True).start()
target = server.server_address[1]
auth = {"Proxy-Authorization": "Basic " + base64.b64encode(f"budgetbench:{token}".encode()).decode()}
print("ready", flush=True); sys.stdin.readline()
for i in range(n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    if i % 2:
        c.set_tunnel("127.0.0.2", target, headers=auth); c.request("GET", "/t")
    else:
        c.request("GET", f"http://127.0.0.2:{target}/p", headers=auth)
    assert c.getresponse().read() == b"ok"
    c.close()
print("done", flush=True)
"""


class Cell:
    """What the proxy charges: the terminal row's ``metered`` and the late-call log."""

    def __init__(self) -> None:
        self.metered: dict = {}

    def late(self, purpose: str, reason: str) -> None:
        raise AssertionError(f"refused: {purpose}: {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/proxy.json"))
    args = parser.parse_args()
    proxy = OutsideProxy()
    proxy.start()
    token = proxy.register("bench", ["127.0.0.2"])
    cell = Cell()
    proxy.bind(token, cell)  # type: ignore[arg-type]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, token, str(proxy.port), str(args.requests)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    cpu, wall = time.process_time(), time.perf_counter()
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "done"
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    child.wait()
    proxy.unbind(token)
    proxy.stop()
    outside = cell.metered["outside"]
    assert outside["calls"] == args.requests, outside
    result = {
        "requests": args.requests,
        "harness_cpu_ms_per_request": round(cpu / args.requests * 1000, 3),
        "wall_ms_per_request": round(wall / args.requests * 1000, 3),
        "bytes_metered": outside["bytes_sent"] + outside["bytes_received"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cores": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
