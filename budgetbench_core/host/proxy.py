"""The run's outside proxy: the only way out of a plugin worker to a host that is not the gateway.

A vendor's memory layer may need its own hosted service. Its worker gets ``HTTP_PROXY`` and
``HTTPS_PROXY`` pointing here, with a token of its own as the proxy credentials (clients send
them as ``Proxy-Authorization``); Landlock lets it connect to this port and the gateway's, no
other. A request (``CONNECT host:port`` for HTTPS, an absolute ``http://`` URL for HTTP) is
let through only while that worker's ``apply`` runs and only to a host its plugin declared
(``network_hosts()``); it is then metered against the cell by host: connections ("calls") and
bytes each way (for HTTPS the tunnel's encrypted bytes: the proxy never sees inside TLS).
Anything else is refused with 403 and recorded as undeclared network use: in the cell's
``metered.undeclared`` (when a cell is running) and in ``late_calls.jsonl``. When ``apply``
ends its tunnels are closed, so nothing is carried on for a cell that has finished.
"""

from __future__ import annotations

import base64
import ipaddress
import secrets
import selectors
import socket
import socketserver
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from ..cell import CellLog

MAX_HEAD = 64 * 1024
CONNECT_TIMEOUT_S = 30.0
DRAIN_S = 5.0  # how long unbinding waits for a closed tunnel's figures


class NetworkDeclarationError(ValueError):
    """A ``network_hosts()`` entry that is not ``host`` or ``host:port``."""


def parse_hosts(declared: Any, plugin: str) -> list[str]:
    """``network_hosts()`` checked: a list of ``host`` or ``host:port`` strings, lower-cased."""
    if not isinstance(declared, (list, tuple)) or not all(isinstance(h, str) for h in declared):
        raise NetworkDeclarationError(f"{plugin}: network_hosts() must return list[str], got {declared!r:.200}")
    hosts = []
    for entry in declared:
        host, _, port = entry.strip().lower().rpartition(":") if ":" in entry else (entry.strip().lower(), "", "")
        if not host or "/" in host or (port and not port.isdigit()):
            raise NetworkDeclarationError(
                f"{plugin}: network_hosts() entry {entry!r} is not 'host' or 'host:port' (no scheme, no path)"
            )
        hosts.append(f"{host}:{int(port)}" if port else host)
    return sorted(set(hosts))


@dataclass
class _Client:
    """One worker: what its plugin declared, and the cell its ``apply`` is running now."""

    plugin: str
    hosts: list[str]
    cell: CellLog | None = None
    last: CellLog | None = None  # the cell it served last: refusals outside apply are recorded there
    tunnels: list[tuple[list[socket.socket], threading.Event]] = field(default_factory=list)

    def declared(self, host: str, port: int) -> bool:
        return host in self.hosts or f"{host}:{port}" in self.hosts


class OutsideProxy:
    """A CONNECT and plain-HTTP proxy on loopback, one token per worker (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, _Client] = {}
        self._server: socketserver.ThreadingTCPServer | None = None
        self.unattributed: list[dict[str, Any]] = []  # refusals before a worker served any cell
        self.guarded_ports: set[int] = set()  # loopback ports of the harness and its servers: never through here

    def start(self) -> None:
        if self._server is None:
            self._server = _Server(("127.0.0.1", 0), _handler(self))
            serve = {"poll_interval": 0.02}  # stop() waits until the loop next looks (0.5 s by default)
            threading.Thread(target=self._server.serve_forever, kwargs=serve, name="outside-proxy", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            clients = list(self._clients)
        for token in clients:
            self.unbind(token)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return int(self._server.server_address[1])

    def register(self, plugin: str, hosts: list[str]) -> str:
        """A new worker's token; requests with it may reach ``hosts`` while it is bound to a cell."""
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._clients[token] = _Client(plugin, list(hosts))
        return token

    def declare(self, token: str, hosts: list[str]) -> None:
        """What the worker's plugin declared (``network_hosts()``), once it is created."""
        with self._lock:
            client = self._clients.get(token)
            if client is not None:
                client.hosts = list(hosts)

    def environment(self, token: str) -> dict[str, str]:
        """The proxy settings every common HTTP client reads."""
        url = f"http://budgetbench:{token}@127.0.0.1:{self.port}"
        return {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}

    def bind(self, token: str, cell: CellLog | None) -> None:
        with self._lock:
            client = self._clients.get(token)
            if client is not None:
                client.cell = cell
                client.last = cell or client.last

    def unbind(self, token: str) -> None:
        """End the worker's cell here: its open tunnels are closed and their figures recorded."""
        with self._lock:
            client = self._clients.get(token)
            if client is None:
                return
            client.cell = None
            tunnels, client.tunnels = client.tunnels, []
        for sockets, done in tunnels:
            for sock in sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            done.wait(DRAIN_S)

    # ------------------------------------------------------------- requests

    def _authorise(self, headers: dict[str, str], host: str, port: int) -> tuple[_Client | None, CellLog | None, str]:
        """Who asks (by token), the cell to charge, and '' when it may pass (else why not)."""
        token = _token(headers.get("proxy-authorization", ""))
        with self._lock:
            client = self._clients.get(token or "")
        if client is None:
            return None, None, "no proxy credentials of a BudgetBench worker"
        if not client.declared(host, port):
            return client, client.cell or client.last, "undeclared network use"
        if client.cell is None:
            return client, client.last, "declared host outside apply (no cell to charge)"
        return client, client.cell, ""

    def _refused(self, client: _Client | None, cell: CellLog | None, host: str, port: int, reason: str) -> None:
        target = f"{host}:{port}"
        if client is None:
            return  # no worker to name: nothing a plugin sent with its token
        if cell is None:
            with self._lock:
                self.unattributed.append({"plugin": client.plugin, "host": target, "reason": reason})
            return
        if client.cell is cell:
            with self._lock:
                undeclared = cell.metered.setdefault("undeclared", {"calls": 0, "hosts": {}})
                undeclared["calls"] += 1
                undeclared["hosts"][target] = undeclared["hosts"].get(target, 0) + 1
        cell.late(
            f"network {target}",
            f"{reason}: {client.plugin} tried to reach {target}, which its network_hosts() "
            f"({', '.join(client.hosts) or 'none'}) does not allow now; refused by the harness's proxy",
        )

    def _metered(self, cell: CellLog, host: str, port: int, sent: int, received: int) -> None:
        target = f"{host}:{port}"
        with self._lock:
            outside = cell.metered.setdefault(
                "outside", {"calls": 0, "bytes_sent": 0, "bytes_received": 0, "hosts": {}}
            )
            per_host = outside["hosts"].setdefault(target, {"calls": 0, "bytes_sent": 0, "bytes_received": 0})
            for figures in (outside, per_host):
                figures["calls"] += 1
                figures["bytes_sent"] += sent
                figures["bytes_received"] += received

    def serve(self, conn: socket.socket) -> None:
        head, rest = _read_head(conn)
        if head is None:
            return
        try:
            method, target, version, headers = _parse(head)
            host, port, upstream_head = _destination(method, target, version, head)
        except ValueError as exc:
            _reply(conn, 400, str(exc))
            return
        client, cell, refusal = self._authorise(headers, host, port)
        if not refusal and port in self.guarded_ports and _is_loopback(host):
            refusal = "undeclared network use (the harness's own servers are reached through the gateway only)"
        if refusal:
            self._refused(client, cell, host, port, refusal)
            _reply(conn, 407 if client is None else 403, refusal)
            return
        assert client is not None and cell is not None
        try:
            upstream = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            self._metered(cell, host, port, 0, 0)
            _reply(conn, 502, f"could not reach {host}:{port}: {exc}")
            return
        done = threading.Event()
        with self._lock:
            live = client.cell is cell  # apply may have ended while we connected
            if live:
                client.tunnels.append(([conn, upstream], done))
        if not live:
            upstream.close()
            self._refused(client, cell, host, port, "declared host outside apply (no cell to charge)")
            _reply(conn, 403, "the cell ended before the connection was made")
            return
        sent = received = 0
        try:
            upstream.settimeout(None)
            if method == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                upstream.sendall(upstream_head)
                sent += len(upstream_head)
            if rest:
                upstream.sendall(rest)
                sent += len(rest)
            more_sent, received = _pump(conn, upstream)
            sent += more_sent
        finally:
            upstream.close()
            self._metered(cell, host, port, sent, received)
            done.set()


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is or resolves to a loopback address (a declared name may point there)."""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return any(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses)


def _token(authorization: str) -> str | None:
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user_pass = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    return user_pass.partition(":")[2] or None


def _read_head(conn: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
        if len(data) > MAX_HEAD:
            _reply(conn, 431, "request head too large")
            return None, b""
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _parse(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise ValueError(f"not an HTTP request line: {lines[0][:200]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return parts[0].upper(), parts[1], parts[2], headers


def _destination(method: str, target: str, version: str, head: bytes) -> tuple[str, int, bytes]:
    """Host, port and, for plain HTTP, the request head to send on (origin form, no proxy headers)."""
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"CONNECT needs host:port, got {target!r}")
        return host.strip("[]").lower(), int(port), b""
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise ValueError(f"a proxy request needs an absolute http:// URL (HTTPS goes through CONNECT), got {target!r}")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    kept = [
        line
        for line in head.decode("latin-1").split("\r\n")[1:]
        if line
        and line.split(":", 1)[0].strip().lower() not in ("proxy-authorization", "proxy-connection", "connection")
    ]
    lines = [f"{method} {path} {version}", *kept, "Connection: close", "", ""]
    return url.hostname.lower(), url.port or 80, "\r\n".join(lines).encode("latin-1")


def _pump(client: socket.socket, upstream: socket.socket) -> tuple[int, int]:
    """Copy bytes both ways until either side closes; returns (client to upstream, back)."""
    counts = {client: 0, upstream: 0}
    other = {client: upstream, upstream: client}
    with selectors.DefaultSelector() as selector:
        for sock in counts:
            selector.register(sock, selectors.EVENT_READ, data=sock)
        while True:
            for key, _ in selector.select():
                ready: socket.socket = key.data
                try:
                    data = ready.recv(65536)
                    if data:
                        other[ready].sendall(data)
                except OSError:
                    data = b""
                if not data:
                    return counts[client], counts[upstream]
                counts[ready] += len(data)


def _reply(conn: socket.socket, status: int, message: str) -> None:
    body = f"BudgetBench proxy: {message}\n".encode()
    reasons = {
        400: "Bad Request",
        403: "Forbidden",
        407: "Proxy Authentication Required",
        431: "Too Large",
        502: "Bad Gateway",
    }
    head = f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    try:
        conn.sendall(head.encode("latin-1") + body)
    except OSError:
        pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def _handler(proxy: OutsideProxy) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            try:
                proxy.serve(self.request)
            except OSError:
                pass

    return Handler
