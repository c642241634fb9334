"""BudgetBench core: the public API that every plugin, built-in or third-party, uses."""

from .backends import Backend, Completion, GenerationParams, ResponseError, TransportError
from .datasets import resolve_data_file
from .graders import Grader, GradingContext, Verdict
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
from .messages import ROLES, Item, Message, Session
from .runlog import final_rows, read_manifest
from .runner import AuxiliaryBudgetError, RunConfig, run
from .strategies import MemoryStrategy, Regime, StrategyContext
from .tasks import Task, TaskDataError
from .tokenizers import PromptCounter, Tokenizer, TokenizerInfo, use_bundled_tiktoken_encodings

__all__ = [
    "ROLES", "AuxiliaryBudgetError", "Backend", "BudgetFill", "Completion", "GenerationParams", "Grader",
    "GradingContext", "IngestFailure", "IngestLossError", "IngestReport", "Item", "MemoryStrategy", "MemorySystem",
    "Message", "PromptCounter", "Regime", "ResponseError", "RetrievedItem", "RunConfig", "Session",
    "StrategyContext", "Task", "TaskDataError", "Tokenizer", "TokenizerInfo", "TransportError", "Verdict",
    "fill_budget", "final_rows", "hookimpl", "read_manifest", "resolve_data_file", "run",
    "use_bundled_tiktoken_encodings",
]
