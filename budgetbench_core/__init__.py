"""BudgetBench core: the public API that every plugin, built-in or third-party, uses.

Everything a plugin may import is in ``__all__`` (plus ``budgetbench_core.testing`` for
its tests); other modules are private. ``wilson`` and ``pass_k`` are loaded on first use,
because the report package pulls in scipy, slow to import, and ``budgetbench --version``
should not pay for it.
"""

from typing import Any

from .backends import (
    AsyncBackend,
    Backend,
    BackendCheck,
    Completion,
    FatalError,
    GenerationParams,
    ResponseError,
    TransportError,
)
from .data_files import data_dir, resolve_data_file
from .datasets import Dataset
from .episodes import Episode, EpisodicTask, JudgeChannel, Step, UserChannel, keep_exchanges, split_exchange
from .evidence import EVIDENCE_ID_KEY, EVIDENCE_KEY
from .executors import (
    CallReply,
    CallRequest,
    DriverCalls,
    Executor,
    Job,
    SharedReplies,
    Unit,
    UnitOutcome,
    UnitWorker,
    WorkerSpec,
)
from .graders import Grader, GradingContext, Verdict, contains_answer
from .hookspecs import hookimpl
from .memory_systems import (
    BudgetFill,
    IngestFailure,
    IngestLossError,
    IngestReport,
    MemorySystem,
    RetrievedItem,
    fill_budget,
)
from .messages import ROLES, TOOL_CALL_ID, TOOL_CALLS, Item, Message, Session
from .params import Param
from .run_reader import RunReadError, VerifiedRun, read_run
from .runlog import final_rows, iter_events, read_manifest, redact
from .runner import AuxiliaryBudgetError, RunConfig, run
from .selection import balanced
from .strategies import MemoryStrategy, Regime, StrategyContext
from .tasks import Task, TaskDataError
from .tokenizers import CountCache, PromptCounter, Tokenizer, TokenizerInfo, use_bundled_tiktoken_encodings

__all__ = [
    "EVIDENCE_ID_KEY",
    "EVIDENCE_KEY",
    "Executor",
    "Job",
    "Unit",
    "UnitOutcome",
    "UnitWorker",
    "WorkerSpec",
    "ROLES",
    "AuxiliaryBudgetError",
    "AsyncBackend",
    "Backend",
    "BackendCheck",
    "Episode",
    "EpisodicTask",
    "Step",
    "UserChannel",
    "JudgeChannel",
    "BudgetFill",
    "Completion",
    "CountCache",
    "Dataset",
    "FatalError",
    "GenerationParams",
    "Grader",
    "GradingContext",
    "IngestFailure",
    "IngestLossError",
    "IngestReport",
    "Item",
    "MemoryStrategy",
    "MemorySystem",
    "Message",
    "TOOL_CALLS",
    "TOOL_CALL_ID",
    "Param",
    "PromptCounter",
    "Regime",
    "ResponseError",
    "RetrievedItem",
    "RunConfig",
    "RunReadError",
    "Session",
    "SharedReplies",
    "CallReply",
    "CallRequest",
    "DriverCalls",
    "StrategyContext",
    "Task",
    "TaskDataError",
    "Tokenizer",
    "TokenizerInfo",
    "TransportError",
    "Verdict",
    "VerifiedRun",
    "balanced",
    "contains_answer",
    "data_dir",
    "fill_budget",
    "final_rows",
    "hookimpl",
    "keep_exchanges",
    "split_exchange",
    "iter_events",
    "read_manifest",
    "read_run",
    "redact",
    "resolve_data_file",
    "pass_k",
    "run",
    "use_bundled_tiktoken_encodings",
    "wilson",
]


def __getattr__(name: str) -> Any:
    if name == "wilson":
        from .report.stats import wilson

        return wilson
    if name == "pass_k":
        from .report.pass_k import pass_k

        return pass_k
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
