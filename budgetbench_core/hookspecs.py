"""The hooks plugins implement (pluggy, project name ``budgetbench``).

Registration hooks take a ``register`` callback (the simonw/llm style). Resolution hooks
are ``firstresult`` (the pytest style): the first implementation that returns something
other than ``None`` wins; the built-ins are ``trylast`` so a plugin can claim a model
string or a tokenizer spec before them.

The registry calls every hook one implementation at a time (``plugins.Registry``), so each
registered name is attributed to the distribution whose implementation registered it and a
failure is blamed on it alone; ``specname=`` and wrappers work as in pytest (docs/hooks.md).
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("budgetbench")
hookimpl = pluggy.HookimplMarker("budgetbench")


@hookspec
def register_strategies(register: Any) -> None:
    """Register MemoryStrategy or MemorySystem subclasses: ``register(StrategyClass)``."""


@hookspec
def register_tasks(register: Any) -> None:
    """Register Task subclasses: ``register(TaskClass)``."""


@hookspec
def register_graders(register: Any) -> None:
    """Register Grader subclasses: ``register(GraderClass)``."""


@hookspec
def register_backends(register: Any) -> None:
    """Register Backend subclasses: ``register(BackendClass)``; ``resolve_backend`` selects one."""


@hookspec
def register_tokenizers(register: Any) -> None:
    """Register tokenizer spec prefixes: ``register("prefix", factory)``.

    ``factory(argument, backend)`` returns a Tokenizer for the spec ``prefix:argument``;
    ``backend`` is the started Backend (the ``server`` spec asks its server).
    """


@hookspec
def register_datasets(register: Any) -> None:
    """Register official data files for ``budgetbench data fetch``: ``register(Dataset(...))``."""


@hookspec
def register_executors(register: Any) -> None:
    """Register Executor subclasses, which schedule a run's units: ``register(ExecutorClass)``.

    ``--executor NAME`` selects one (the built-in ``thread`` by default); whatever the
    executor, the driver process alone writes the run directory.
    """


@hookspec
def register_commands(cli: Any) -> None:
    """Add click commands to the ``budgetbench`` group: ``@cli.group("myplugin")``."""


@hookspec(firstresult=True)
def resolve_backend(model: str) -> str | None:
    """The name of the registered backend that serves the ``--model`` string, or ``None``.

    The built-in ``local`` backend claims ``local`` and ``local:<gguf>``; ``litellm``
    (``trylast``) claims everything else, so a plugin that claims ``myvendor/...`` wins.
    """


@hookspec(firstresult=True)
def resolve_tokenizer(spec: str, backend: Any) -> Any:
    """A Tokenizer for the ``--tokenizer`` spec, or ``None`` to leave it to the others.

    The core's own implementation (``trylast``) looks ``prefix:argument`` up among the
    prefixes registered with ``register_tokenizers``.
    """
