"""BudgetBench core: the public API that every plugin, built-in or third-party, uses.

Everything a plugin may import is in ``__all__`` (plus ``budgetbench_core.testing`` for
its tests); other modules are private. Each name is imported from its module on first use
(PEP 562), so a process imports only what it uses: a plugin worker starts without the
runner, the report (scipy) or the model clients, and ``budgetbench --version`` is quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker and an editor see (``as``: re-exported); at run time ``__getattr__``
    from .backends import (
        AsyncBackend as AsyncBackend,
        Backend as Backend,
        BackendCheck as BackendCheck,
        Completion as Completion,
        FatalError as FatalError,
        GenerationParams as GenerationParams,
        ResponseError as ResponseError,
        TransportError as TransportError,
    )
    from .data_files import data_dir as data_dir, resolve_data_file as resolve_data_file
    from .datasets import Dataset as Dataset
    from .episodes import (
        Episode as Episode,
        EpisodicTask as EpisodicTask,
        JudgeChannel as JudgeChannel,
        Step as Step,
        UserChannel as UserChannel,
        keep_exchanges as keep_exchanges,
        split_exchange as split_exchange,
    )
    from .evidence import EVIDENCE_ID_KEY as EVIDENCE_ID_KEY, EVIDENCE_KEY as EVIDENCE_KEY
    from .executors import (
        CallReply as CallReply,
        CallRequest as CallRequest,
        DriverCalls as DriverCalls,
        Executor as Executor,
        Job as Job,
        SharedReplies as SharedReplies,
        Unit as Unit,
        UnitOutcome as UnitOutcome,
        UnitWorker as UnitWorker,
        WorkerSpec as WorkerSpec,
    )
    from .gate import AuxiliaryBudgetError as AuxiliaryBudgetError
    from .graders import (
        Grader as Grader,
        GradingContext as GradingContext,
        Verdict as Verdict,
        contains_answer as contains_answer,
    )
    from .hookspecs import hookimpl as hookimpl
    from .memory_systems import (
        BudgetFill as BudgetFill,
        IngestFailure as IngestFailure,
        IngestLossError as IngestLossError,
        IngestReport as IngestReport,
        MemorySystem as MemorySystem,
        RetrievedItem as RetrievedItem,
        fill_budget as fill_budget,
    )
    from .messages import (
        ROLES as ROLES,
        TOOL_CALL_ID as TOOL_CALL_ID,
        TOOL_CALLS as TOOL_CALLS,
        Item as Item,
        Message as Message,
        Session as Session,
    )
    from .params import Param as Param
    from .report.pass_k import pass_k as pass_k
    from .report.stats import wilson as wilson
    from .run_reader import RunReadError as RunReadError, VerifiedRun as VerifiedRun, read_run as read_run
    from .runlog import (
        final_rows as final_rows,
        iter_events as iter_events,
        read_manifest as read_manifest,
        redact as redact,
    )
    from .runner import RunConfig as RunConfig, run as run
    from .selection import balanced as balanced
    from .strategies import MemoryStrategy as MemoryStrategy, Regime as Regime, StrategyContext as StrategyContext
    from .tasks import Task as Task, TaskDataError as TaskDataError
    from .tokenizers import (
        CountCache as CountCache,
        PromptCounter as PromptCounter,
        Tokenizer as Tokenizer,
        TokenizerInfo as TokenizerInfo,
        use_bundled_tiktoken_encodings as use_bundled_tiktoken_encodings,
    )

_MODULES: dict[str, tuple[str, ...]] = {  # module -> the public names it defines
    "backends": (
        "AsyncBackend",
        "Backend",
        "BackendCheck",
        "Completion",
        "FatalError",
        "GenerationParams",
        "ResponseError",
        "TransportError",
    ),
    "data_files": ("data_dir", "resolve_data_file"),
    "datasets": ("Dataset",),
    "episodes": ("Episode", "EpisodicTask", "JudgeChannel", "Step", "UserChannel", "keep_exchanges", "split_exchange"),
    "evidence": ("EVIDENCE_ID_KEY", "EVIDENCE_KEY"),
    "executors": (
        "CallReply",
        "CallRequest",
        "DriverCalls",
        "Executor",
        "Job",
        "SharedReplies",
        "Unit",
        "UnitOutcome",
        "UnitWorker",
        "WorkerSpec",
    ),
    "graders": ("Grader", "GradingContext", "Verdict", "contains_answer"),
    "hookspecs": ("hookimpl",),
    "memory_systems": (
        "BudgetFill",
        "IngestFailure",
        "IngestLossError",
        "IngestReport",
        "MemorySystem",
        "RetrievedItem",
        "fill_budget",
    ),
    "messages": ("ROLES", "TOOL_CALL_ID", "TOOL_CALLS", "Item", "Message", "Session"),
    "params": ("Param",),
    "run_reader": ("RunReadError", "VerifiedRun", "read_run"),
    "runlog": ("final_rows", "iter_events", "read_manifest", "redact"),
    "gate": ("AuxiliaryBudgetError",),
    "runner": ("RunConfig", "run"),
    "selection": ("balanced",),
    "strategies": ("MemoryStrategy", "Regime", "StrategyContext"),
    "tasks": ("Task", "TaskDataError"),
    "tokenizers": ("CountCache", "PromptCounter", "Tokenizer", "TokenizerInfo", "use_bundled_tiktoken_encodings"),
    "report.pass_k": ("pass_k",),
    "report.stats": ("wilson",),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
