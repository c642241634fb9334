"""Registers the ``tau-bench`` task, its dataset (the tau2-bench domain files) and the ``taubench`` commands."""

from budgetbench_core import Dataset, hookimpl

from .commands import register_commands
from .domain import PINNED_COMMIT
from .task import TauBench

__all__ = ["register_commands", "register_datasets", "register_tasks"]

UPSTREAM = "sierra-research/tau2-bench"
DOMAIN_FILES = {
    "retail": ("db.json", "tasks.json", "split_tasks.json", "policy.md"),
    "airline": ("db.json", "tasks.json", "split_tasks.json", "policy.md"),
    "mock": ("db.json", "tasks.json", "split_tasks.json", "policy.md"),
    "telecom": (
        "db.toml",
        "user_db.toml",
        "tasks.json",
        "split_tasks.json",
        "main_policy.md",
        "tech_support_manual.md",
    ),
}
# upstream path -> path under $BUDGETBENCH_DATA_DIR/taubench, the layout the task reads
FILES = {
    **{
        f"data/tau2/domains/{domain}/{name}": f"{domain}/{name}"
        for domain, names in DOMAIN_FILES.items()
        for name in names
    },
    "data/tau2/user_simulator/simulation_guidelines.md": "simulation_guidelines.md",
}
WHERE = (
    f"the files come from the tau2-bench repository, https://github.com/{UPSTREAM} (Sierra Research, "
    f"MIT licence), at commit {PINNED_COMMIT}: each domain's data/tau2/domains/<domain>/ folder and "
    "data/tau2/user_simulator/simulation_guidelines.md. `git clone` it (git lfs pull if a file is a "
    "Git LFS pointer) and copy each file to the path below; a domain you do not run may stay missing"
)


@hookimpl
def register_tasks(register):
    register(TauBench)


@hookimpl
def register_datasets(register):
    register(
        Dataset(
            "tau-bench",
            UPSTREAM,
            "taubench",
            FILES,
            "tau2-bench retail, airline, telecom and mock domains (MIT; placed by hand from GitHub)",
            manual=WHERE,
        )
    )
