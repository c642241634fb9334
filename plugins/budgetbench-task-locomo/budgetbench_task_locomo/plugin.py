"""The distribution's one entry point: the ``locomo`` task and its dataset, the two graders."""

from budgetbench_core import Dataset, hookimpl

from .graders import register_graders
from .task import DATASET, DEFAULT_FILE, LoCoMo

__all__ = ["register_datasets", "register_graders", "register_tasks"]

# Where the file comes from and on what terms: printed by `budgetbench data fetch locomo`.
WHERE = (
    "download data/locomo10.json from https://github.com/snap-research/LoCoMo (the official release, "
    "tested at commit 3eb6f2c, 2,805,274 bytes). It is licensed CC BY-NC 4.0 (non-commercial use, "
    "attribution): it is never bundled with BudgetBench, and fetching it is left to you."
)


@hookimpl
def register_tasks(register):
    register(LoCoMo)


@hookimpl
def register_datasets(register):
    register(
        Dataset(
            "locomo",
            "snap-research/LoCoMo",
            DATASET,
            {"data/locomo10.json": DEFAULT_FILE},
            "LoCoMo (10 conversations, 1,986 questions; CC BY-NC 4.0, placed by hand)",
            manual=WHERE,
        )
    )
