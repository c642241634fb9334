"""The plugins a run's config names, created once and attributed to their distributions.

The driver builds this from its config; a remote worker builds the same from the driver's
config and task object, so both count, call and grade with the same plugins.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from ..backends import Backend
from ..controls import is_control
from ..episodes import EpisodicTask
from ..graders import Grader
from ..plugins import PluginError, PluginInfo, Registry
from ..run_config import RunConfig, RunConfigError
from ..sandbox import Deadline, PluginFailure, PluginRef, contained
from ..tasks import Task, TaskDataError, hidden_metadata_keys
from ..tokenizers import Tokenizer

LOAD_TIMEOUT_S = 3600.0  # reading a whole official dataset file may be slow; a hang is still caught
JUDGE_CONTEXT = 32768  # the context a separate judge backend is opened with


class RunPlugins:
    """Task, grader, backends and tokenizer of one run; ``ref`` names any plugin's distribution."""

    def __init__(self, config: RunConfig, registry: Registry, task: Task | None = None) -> None:
        self.config = config
        self.registry = registry
        self.task: Task = task if task is not None else self.instantiate("task", config.task, **config.task_options)
        try:  # grading-only message metadata, withheld from every strategy's view (PrivateView)
            self.hidden_metadata = hidden_metadata_keys(self.task)
        except TypeError as exc:
            raise PluginError(str(exc)) from None
        self.grader_name = config.grader or self.task.default_grader
        self.grader: Grader = self.instantiate("grader", self.grader_name)
        self.max_output_tokens = config.max_output_tokens or self.task.max_output_tokens
        resolved = registry.resolve_backend(config.model)  # the resolve_backend hook: plugins may claim a model
        self.backend_name = resolved.name
        self.backend: Backend = resolved.obj(
            config.model,
            api_base=config.api_base,
            timeout_s=config.timeout_s,
            max_context=max(config.budgets) + self.max_output_tokens,
            max_concurrency=config.max_concurrency,
            server_prompt_cache=config.server_prompt_cache,
        )
        if isinstance(self.task, EpisodicTask) and self.task.native_tools() and not self.backend.native_tools:
            raise RunConfigError(
                f"task {config.task!r} sends tool schemas natively (native tool calls), and backend "
                f"{self.backend_name!r} (--model {config.model}) cannot send them: use a backend with native "
                f"tool calls (local, litellm) or the task's JSON-action mode"
            )
        self.judge_backend: Backend | None = None
        if config.judge_model and config.judge_model != config.model:
            self.judge_backend = registry.resolve_backend(config.judge_model).obj(
                config.judge_model,
                timeout_s=config.timeout_s,
                max_context=JUDGE_CONTEXT,
                max_concurrency=config.max_concurrency,
                server_prompt_cache=config.server_prompt_cache,
            )
        self.tokenizer_ref = PluginRef("tokenizer", config.tokenizer or "")
        self.tokenizer_plugin: PluginInfo | None = None

    def ref(self, kind: str, name: str) -> PluginRef:
        return PluginRef(kind, name, self.plugin_of(kind, name).distribution)

    def plugin_of(self, kind: str, name: str) -> PluginInfo:
        """The distribution that provides ``name``; the core itself for a harness control."""
        if kind == "strategy" and is_control(name):
            return PluginInfo(name, "budgetbench", metadata.version("budgetbench"))
        return self.registry.locate(kind, name)

    def instantiate(self, kind: str, name: str, **params: Any) -> Any:
        registered = self.registry.get(kind, name)
        try:
            return contained("create", self.ref(kind, name), lambda: registered.obj(**params), Deadline(LOAD_TIMEOUT_S))
        except PluginFailure as failure:
            if isinstance(failure.original, TaskDataError):
                raise failure.original from None  # already names the file, record and field
            raise PluginError(
                f"{kind} {name!r} from {registered.plugin.distribution} could not be created with "
                f"{params}: {failure.cause}"
            ) from None

    def start(self) -> None:
        self.backend.start()
        if self.judge_backend:
            self.judge_backend.start()

    def stop(self) -> None:
        self.backend.stop()
        if self.judge_backend:
            self.judge_backend.stop()

    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer (``--tokenizer`` or the backend's default), created contained."""
        spec = self.tokenizer_spec()
        prefix = spec.partition(":")[0]  # the resolve_tokenizer hook; registered prefixes are the core's fallback
        registered = prefix in self.registry.names("tokenizer")
        self.tokenizer_ref = self.ref("tokenizer", prefix) if registered else PluginRef("tokenizer", spec)
        try:
            tokenizer, self.tokenizer_plugin = contained(
                "create",
                self.tokenizer_ref,
                lambda: self.registry.resolve_tokenizer_source(spec, self.backend),
                Deadline(LOAD_TIMEOUT_S),
            )
        except PluginFailure as failure:
            if isinstance(failure.original, (ValueError, OSError, PluginError)) and not isinstance(
                failure.original, PluginFailure
            ):
                raise failure.original from None  # a clear message about the spec, file or plugin
            raise PluginError(failure.cause) from None
        self.tokenizer_ref = PluginRef("tokenizer", self.tokenizer_ref.name, self.tokenizer_plugin.distribution)
        return tokenizer

    def tokenizer_spec(self) -> str:
        spec = self.config.tokenizer or self.backend.default_tokenizer()
        if not spec:
            raise RunConfigError(
                f"model {self.config.model!r} has no default tokenizer: pass --tokenizer "
                f"(hf:<dir>, tiktoken:<encoding>, gguf:<file> or server)"
            )
        return spec

    def versions(self) -> dict[str, str]:
        """Every distribution the run uses, with its version (after ``tokenizer()``)."""
        used = [
            ("task", self.config.task),
            ("grader", self.grader_name),
            ("backend", self.backend_name),
            *(("strategy", s) for s in self.config.strategies),
        ]
        versions = {"budgetbench": metadata.version("budgetbench")}
        if self.tokenizer_plugin is not None:  # resolved, maybe unregistered
            versions[self.tokenizer_plugin.distribution] = self.tokenizer_plugin.version
        for kind, name in used:
            plugin = self.plugin_of(kind, name)
            versions[plugin.distribution] = plugin.version
        return dict(sorted(versions.items()))
