"""Shared pieces of the benchmark scripts: loopback servers, LongMemEval_S items, results.

The fake OpenAI-compatible server runs in a child process so its CPU time never
competes with the harness for the GIL; it reports, per request, how long it spent
between reading the request and writing the reply, and how many requests it held
at once, so the harness's own time is measured in the same run as the server's.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from budgetbench_core.loopback import send_json  # the reply writer the tests' FaultServer uses

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DATA = ROOT.parent / "shared" / "data"
LONGMEMEVAL_S = DATA / "longmemeval" / "longmemeval_s_sample.json"
BENCH_TASK = "bench-longmemeval-s"

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ----------------------------------------------------------------- machine and results


def machine() -> dict[str, Any]:
    """What the figures were measured on, including how busy it was."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "git_commit": commit,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    command = " ".join(["python", "benchmarks/" + Path(sys.argv[0]).name, *sys.argv[1:]])
    payload = {"benchmark": name, "command": command, **data, "machine_end": machine()}
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}")
    return path


@contextlib.contextmanager
def chars_tokenised() -> Iterator[list[int]]:
    """Counts the characters tiktoken tokenises (after the harness's caches) while the block
    runs, in the list's one element: counting work, a figure that does not move with the
    machine's speed."""
    from budgetbench_core.builtin.tokenizers import TiktokenTokenizer

    tokenised = [0]
    encoded = TiktokenTokenizer._encoded_length

    def counting(self, text):
        tokenised[0] += len(text)
        return encoded(self, text)

    TiktokenTokenizer._encoded_length = counting
    try:
        yield tokenised
    finally:
        TiktokenTokenizer._encoded_length = encoded


def median(values) -> float:
    return statistics.median(list(values))


def require_data() -> None:
    if not LONGMEMEVAL_S.exists():
        sys.exit(f"missing {LONGMEMEVAL_S}: the LongMemEval_S sample is needed (see ../shared/data/README.md)")


# ----------------------------------------------------------------- the fake OpenAI-compatible server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # otherwise delayed ACKs add ~40 ms to every reply
    wbufsize = 1 << 16  # headers and body leave in one write; flushed after each request
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        send_json(self, status, payload, headers)

    def do_GET(self) -> None:
        if self.path == "/stats":
            with self.server.lock:
                self._send(200, dict(self.server.stats))
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        started = time.perf_counter()
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        if self.path == "/reset":
            with self.server.lock:
                self.server.reset_stats()
            self._send(200, {"ok": True})
            return
        request = json.loads(raw)
        with self.server.lock:
            stats = self.server.stats
            stats["inflight"] += 1
            stats["max_inflight"] = max(stats["max_inflight"], stats["inflight"])
            stats["requests"] += 1
            limited = stats["requests"] <= self.server.rate_limit_first
        try:
            if limited:
                with self.server.lock:
                    stats["rate_limited"] += 1
                self._send(
                    429,
                    {"error": {"message": "rate limited", "type": "rate_limit"}},
                    {"Retry-After": str(self.server.retry_after)},
                )
                return
            if self.server.delay_s:
                time.sleep(self.server.delay_s)
            prompt_tokens = self.server.count(request.get("messages", []))
            self._send(
                200,
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": request.get("model", "bench"),
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "I do not know."},
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": 5,
                        "total_tokens": prompt_tokens + 5,
                    },
                },
            )
        finally:
            with self.server.lock:
                stats["inflight"] -= 1
                stats["server_s"] += time.perf_counter() - started


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address, delay_s: float, rate_limit_first: int, retry_after: float) -> None:
        super().__init__(address, _Handler)
        self.delay_s = delay_s
        self.rate_limit_first = rate_limit_first
        self.retry_after = retry_after
        self.lock = threading.Lock()
        self.encoding = None
        self.reset_stats()

    def count(self, messages: list[dict]) -> int:
        """The prompt's tokens as ``tiktoken:cl100k_base`` counts them (the benchmarks' tokenizer), so
        the runner's check of the served count passes, as it would against a real server."""
        if self.encoding is None:
            from budgetbench_core import use_bundled_tiktoken_encodings

            use_bundled_tiktoken_encodings()
            import tiktoken

            self.encoding = tiktoken.get_encoding("cl100k_base")
        encode = self.encoding.encode
        return 3 + sum(
            3
            + len(encode(m.get("role") or "", disallowed_special=()))
            + len(encode(m.get("content") or "", disallowed_special=()))
            for m in messages
        )

    def reset_stats(self) -> None:
        self.stats = {"requests": 0, "inflight": 0, "max_inflight": 0, "server_s": 0.0, "rate_limited": 0}


def _serve(delay_s: float, rate_limit_first: int, retry_after: float) -> None:
    server = _Server(("127.0.0.1", 0), delay_s, rate_limit_first, retry_after)
    parent = os.getppid()

    def exit_with_parent() -> None:  # a benchmark killed mid-run must not leave its server behind
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    print(server.server_address[1], flush=True)
    server.serve_forever(poll_interval=0.05)


class FakeOpenAI:
    """An OpenAI-compatible chat server on loopback, in a child process.

    ``delay_s`` makes every reply wait (a model's latency without its CPU); the first
    ``rate_limit_first`` requests get 429 with ``Retry-After: retry_after``.
    """

    def __init__(self, delay_s: float = 0.0, rate_limit_first: int = 0, retry_after: float = 0.2) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "serve", str(delay_s), str(rate_limit_first), str(retry_after)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self.process.stdout.readline())
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_base = self.base + "/v1"

    def stats(self) -> dict[str, Any]:
        import httpx

        return httpx.get(self.base + "/stats", timeout=10).json()

    def reset(self) -> None:
        import httpx

        httpx.post(self.base + "/reset", content=b"", timeout=10)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)

    def __enter__(self) -> FakeOpenAI:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def short_history_config(server: FakeOpenAI, out: Path, cells: int, concurrency: int):
    """The short-history run against ``server``: synthetic-memory, ``cells`` items of 400
    tokens, truncation at one 2048 tier, counted with tiktoken:cl100k_base."""
    from budgetbench_core import RunConfig

    return RunConfig(
        task="synthetic-memory",
        strategies=["truncation"],
        budgets=[2048],
        out=out,
        model="openai/bench",
        api_base=server.api_base,
        tokenizer="tiktoken:cl100k_base",
        limit=cells,
        max_concurrency=concurrency,
        task_options={"items": cells, "history_tokens": 400},
    )


# ----------------------------------------------------------------- LongMemEval_S items and a task for them

SYSTEM = (
    "You are a helpful assistant with a memory of past chat sessions with the user. "
    "Answer the question using the sessions."
)


def longmemeval_items(limit: int | None = None):
    """LongMemEval_S records as Items: one message per turn, session id and date in metadata."""
    from budgetbench_core import Item, Message

    records = json.loads(LONGMEMEVAL_S.read_text(encoding="utf-8"))
    items = []
    for record in records[:limit]:
        history = []
        for sid, date, session in zip(
            record["haystack_session_ids"], record["haystack_dates"], record["haystack_sessions"]
        ):
            for turn in session:
                history.append(Message(turn["role"], turn["content"], {"session_id": sid, "timestamp": date}))
        items.append(
            Item(
                id=record["question_id"],
                history=tuple(history),
                query=Message("user", f"[{record['question_date']}] {record['question']}"),
                answer=str(record["answer"]),
                system=Message("system", SYSTEM),
                category=record["question_type"],
            )
        )
    return items


def benchmark_registry():
    """The installed plugins plus ``bench-longmemeval-s``, a task over the items above.

    The LongMemEval task plugin is the real loader; this one exists so the benchmarks
    measure the harness on the same histories whether or not that plugin is installed.
    """
    from budgetbench_core import Task, hookimpl
    from budgetbench_core.plugins import PluginInfo, get_registry

    registry = get_registry()
    if BENCH_TASK in registry.names("task"):
        return registry

    class BenchLongMemEvalS(Task):
        name = BENCH_TASK
        default_grader = "contains-answer"
        max_output_tokens = 32
        description = "LongMemEval_S sample items, built by the benchmark scripts"

        def load(self, limit, seed):
            yield from longmemeval_items(limit)

    class Plugin:
        @staticmethod
        @hookimpl
        def register_tasks(register):
            register(BenchLongMemEvalS)

    registry.add_plugin(Plugin, PluginInfo("benchmarks", "benchmarks", "0"))
    return registry


class RSSSampler:
    """Samples this process's resident set size every ``interval_s`` on a thread."""

    def __init__(self, interval_s: float = 0.05) -> None:
        import psutil

        self._process = psutil.Process()
        self.interval_s = interval_s
        self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def current(self) -> int:
        return self._process.memory_info().rss

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self.current())

    def __enter__(self) -> RSSSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current())


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    _serve(float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))


def longmemeval_s_task(registry) -> tuple[str, dict[str, Any], str | None]:
    """(task, task options, grader) over LongMemEval_S: the real plugin when installed, else ours."""
    if "longmemeval" in registry.names("task"):
        return "longmemeval", {"path": str(LONGMEMEVAL_S), "split": "s"}, "longmemeval-match"
    return BENCH_TASK, {}, None
