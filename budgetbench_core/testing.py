"""The public testing surface every distribution's tests use (never private core modules).

The conformance kit (``ConformanceKit``, ``open_kit``, ``standard_items``, ``CheckResult``,
``unreadable_session``; see ``budgetbench_core.conformance`` for its checks) is re-exported here.
Besides it: ``embedded_backend``/``exact_counter`` (the embedded model
and an exact counter on its own tokenizer), ``strategy_context``, ``FaultServer`` (a
loopback OpenAI-compatible server with fault modes), ``invoke_cli`` (the real
``budgetbench`` command group, plugins' commands included), ``shared_data`` (files in
``../shared/data``: a skip locally, a failure under ``CI=true``) and the pytest fixtures
``budgetbench_backend``, ``budgetbench_counter`` and ``budgetbench_kit``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

from .backends import Backend
from .conformance import (
    STANDARD_BUDGETS,
    CheckResult,
    ConformanceKit,
    KitError,
    open_kit,
    standard_items,
    unreadable_session,
)
from .events import CellKey
from .loopback import (
    EXTRA_FAULTS,
    FAULTS,
    NO_COMPLETION,
    USAGE_OFFSET,
    FaultServer,
    default_reply,
    messages_hash,
    send_json,
)
from .messages import Item, Message
from .runlog import final_rows
from .sandbox import PrivateView, opaque_id
from .strategies import StrategyContext
from .tokenizers import PromptCounter, Tokenizer

# ----------------------------------------------------------------- public names (the kit re-exported)

__all__ = [
    "EXTRA_FAULTS",
    "FAULTS",
    "NO_COMPLETION",
    "STANDARD_BUDGETS",
    "USAGE_OFFSET",
    "CheckResult",
    "ConformanceKit",
    "FaultServer",
    "KitError",
    "comparable_rows",
    "default_reply",
    "embedded_backend",
    "entry_point",
    "embedded_model_file",
    "tokenizer_for",
    "exact_counter",
    "invoke_cli",
    "messages_hash",
    "network_confined",
    "no_model_calls",
    "open_kit",
    "registered",
    "registry_with",
    "send_json",
    "shared_data",
    "standard_items",
    "strategy_context",
    "unreadable_session",
]

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@contextlib.contextmanager
def embedded_backend(max_concurrency: int = 1) -> Iterator[Backend]:
    """The embedded model (``--model local``) started for the block, resolved like a run's."""
    from .plugins import get_registry

    backend: Backend = get_registry().resolve_backend("local").obj("local", max_concurrency=max_concurrency)
    backend.start()
    try:
        yield backend
    finally:
        backend.stop()


def exact_counter(backend: Backend, spec: str | None = None) -> PromptCounter:
    """A PromptCounter with ``spec`` (default: the backend's exact tokenizer, ``server`` for
    the embedded model), resolved through the same hooks as a run's."""
    from .plugins import get_registry

    chosen = spec or backend.default_tokenizer()
    if not chosen:
        raise ValueError(f"backend {backend.name!r} has no default tokenizer: give a spec")
    return PromptCounter(get_registry().resolve_tokenizer(chosen, backend))


def tokenizer_for(spec: str, backend: Backend | None = None) -> Tokenizer:
    """The Tokenizer a run would use for ``spec`` (``gguf:<file>``, ``tiktoken:<encoding>``...)."""
    from .plugins import get_registry

    return get_registry().resolve_tokenizer(spec, backend)


def embedded_model_file() -> Path:
    """The GGUF file of the embedded model (``--model local``)."""
    from .builtin.local_backend import default_model_path

    return default_model_path()


def no_model_calls(messages: Sequence[Message], max_tokens: int, purpose: str) -> str:
    """The ``complete`` of a context for strategies that must make no auxiliary call."""
    raise AssertionError(f"unexpected auxiliary model call ({purpose!r})")


_VIEW_KEY = secrets.token_bytes(32)  # this process's, as a run's is the run's: views' ids cannot be computed


def strategy_context(
    item: Item,
    budget: int,
    counter: PromptCounter,
    scratch_dir: Path,
    complete: Callable[[Sequence[Message], int, str], str] | None = None,
    seed: int = 0,
) -> StrategyContext:
    """A StrategyContext as the runner builds one: ``item`` becomes the strategy's view (no
    answer, category, item metadata or evidence marks, and an opaque id: the same for the same
    item within this process, as within a run); ``complete`` defaults to refusing calls."""
    return StrategyContext(
        item=PrivateView(item, view_id=opaque_id(_VIEW_KEY, item.id)).item,
        budget=budget,
        counter=counter,
        complete=complete or no_model_calls,
        seed=seed,
        scratch_dir=Path(scratch_dir),
    )


def registered(kind: str, name: str) -> Any:
    """What the installed plugins registered as ``kind`` ``name``: ``.obj`` (the class,
    factory or Dataset) and ``.plugin`` (``name``, ``distribution``, ``version``, ``hooks``).
    Raises the same error naming the available names as a run would."""
    from .plugins import get_registry

    return get_registry().get(kind, name)


def network_confined() -> bool:
    """Whether a plugin's worker on this machine may connect only to the run's gateway (Landlock
    ABI 4, Linux 6.7+): a test that expects a direct connection to be refused needs it."""
    from .host.landlock import abi_version

    return abi_version() >= 4


def registry_with(*plugins: Any, distribution: str = "test-plugin", version: str = "0.0.1") -> Any:
    """The installed plugins plus ``plugins`` (modules or objects with ``@hookimpl``
    functions) as if ``distribution`` had installed them: pass it to
    ``run(config, registry=...)`` to run a plugin defined in a test."""
    from .plugins import PluginInfo, load_registry

    registry = load_registry()
    for index, plugin in enumerate(plugins):
        name = distribution if len(plugins) == 1 else f"{distribution}-{index}"
        registry.add_plugin(plugin, PluginInfo(name, distribution, version))
    return registry


def entry_point(distribution: str) -> Any:
    """The one ``budgetbench`` entry point of an installed ``distribution`` (the naming rule:
    one per distribution, named after it without ``budgetbench-``); fails the test otherwise."""
    from importlib import metadata

    points = [p for p in metadata.distribution(distribution).entry_points if p.group == "budgetbench"]
    expected = distribution.removeprefix("budgetbench-")
    if len(points) != 1 or points[0].name != expected:
        raise AssertionError(
            f"{distribution} declares entry points {[p.name for p in points]}; expected exactly one named {expected!r}"
        )
    return points[0]


def invoke_cli(*args: str, env: dict[str, str] | None = None) -> Any:
    """Run ``budgetbench ARGS`` in-process on the real command group (plugins' commands
    included); returns click's Result (``exit_code``, ``output``, ``exception``)."""
    from click.testing import CliRunner

    from .cli import cli

    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=True)


_EXECUTION_INDEPENDENT = ("event", "prediction", "quality", "prompt_tokens", "served_prompt_tokens", "verdict", "phase")


def comparable_rows(run_dir: Path) -> dict[CellKey, tuple]:
    """A run's final rows, each reduced to the fields (JSON text) that must not depend on how it
    was executed: threads, another executor or shards merged give equal values on one config."""
    return {
        key: tuple(json.dumps(row.get(f), sort_keys=True) for f in _EXECUTION_INDEPENDENT)
        for key, row in final_rows(run_dir).items()
    }


def shared_data(relative: str) -> Path:
    """``../shared/data/<relative>``; absent, the test is skipped locally but fails under
    ``CI=true``, so a CI machine without the data cannot pass by skipping."""
    path = SHARED_DATA / relative
    if not path.exists():
        message = f"shared test data not found: {path} (see ../shared/data/README.md)"
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(message + "; CI=true, so this is a failure, not a skip")
        pytest.skip(message)
    return path


if importlib.util.find_spec("pytest") is not None:  # the kit itself works without pytest; the fixtures need it
    import pytest

    def _in_ci() -> bool:
        return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport() -> Generator[None, Any, Any]:
        """Under ``CI=true`` a test skipped for want of ``../shared/data`` (by ``shared_data``
        or a ``skipif`` whose reason names that folder) is a failure: CI must run it."""
        report = yield
        if report.skipped and _in_ci():
            reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
            if str(SHARED_DATA) in reason or "shared data" in reason.lower() or "shared/data" in reason:
                report.outcome = "failed"
                report.longrepr = f"CI=true: skipped for want of shared test data, which CI must have: {reason}"
        return report

    @pytest.fixture(scope="session")
    def budgetbench_backend() -> Iterator[Backend]:
        """The embedded model, started once per test session."""
        with embedded_backend() as backend:
            yield backend

    @pytest.fixture(scope="session")
    def budgetbench_counter(budgetbench_backend: Backend) -> PromptCounter:
        """An exact PromptCounter on the embedded model's own template and vocabulary."""
        return exact_counter(budgetbench_backend)

    @pytest.fixture(scope="session")
    def budgetbench_kit() -> Iterator[ConformanceKit]:
        """A ConformanceKit on the embedded model, started once per test session.

        ``budgetbench_kit.assert_conforms(MyStrategy)`` in a plugin's tests runs every check.
        """
        with open_kit() as kit:
            yield kit
