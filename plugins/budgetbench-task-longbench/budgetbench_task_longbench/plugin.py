"""Registers the ``longbench-v2`` task and the ``longbench-choice`` grader."""

from budgetbench_core import Dataset, hookimpl

from .grader import LongBenchChoice
from .task import DATASET, DEFAULT_FILE, LongBenchV2


@hookimpl
def register_tasks(register):
    register(LongBenchV2)


@hookimpl
def register_graders(register):
    register(LongBenchChoice)


@hookimpl
def register_datasets(register):
    register(
        Dataset(
            "longbench-v2",
            "THUDM/LongBench-v2",
            DATASET,
            {"data.json": DEFAULT_FILE},
            "LongBench v2 (503 multiple-choice questions)",
        )
    )
