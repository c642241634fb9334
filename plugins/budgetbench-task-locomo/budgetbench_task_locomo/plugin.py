"""The distribution's one entry point: the ``locomo`` task and its dataset, the two graders."""

from budgetbench_core import Dataset, hookimpl

from .graders import register_graders
from .task import DATASET, DEFAULT_FILE, LoCoMo

__all__ = ["register_datasets", "register_graders", "register_tasks"]

# The official release, pinned: `budgetbench data fetch locomo` downloads data/locomo10.json at this
# commit (2,805,274 bytes) and keeps it only with this SHA-256.
COMMIT = "3eb6f2c585f5e1699204e3c3bdf7adc5c28cb376"
SHA256 = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"
LICENCE = (
    "CC BY-NC 4.0 (non-commercial use, with attribution to Maharana et al., ACL 2024; "
    "https://creativecommons.org/licenses/by-nc/4.0/). It is never bundled with BudgetBench: "
    "it is downloaded for you, on these terms."
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
            "LoCoMo (10 conversations, 1,986 questions; CC BY-NC 4.0)",
            commit=COMMIT,
            sha256={"data/locomo10.json": SHA256},
            licence=LICENCE,
        )
    )
