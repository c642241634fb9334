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
# SHA-256 of each file at PINNED_COMMIT (checked against upstream's git blobs); `data fetch` keeps
# a downloaded or placed file only if it matches.
SHA256 = {
    "data/tau2/domains/retail/db.json": "413a65160adbdb5fde0ffc0015c49b6d70250b10c18128de169b597af7766765",
    "data/tau2/domains/retail/tasks.json": "8e03ebce7901bd6218e7a7dc3105faa9324091a68058f7fe61c65262868812e8",
    "data/tau2/domains/retail/split_tasks.json": "ed0580ec52575b63fbf76568af42490da6ee7783ecb4aa81af46961291358f20",
    "data/tau2/domains/retail/policy.md": "2c9652afbce57d6e087768d37cda64d31c53d50b3e3225cfdb791bac66466467",
    "data/tau2/domains/airline/db.json": "1af9fea6e03ca7ca15a22bb3fcaf3e351393e3fc9070b6777947da8996f7531b",
    "data/tau2/domains/airline/tasks.json": "ccd8ba737b4cc371415af70151187788f728d6108d0916e73bb4317b40542052",
    "data/tau2/domains/airline/split_tasks.json": "b22ced4d9a9850ac9aea31c53bdcb6d6009058140bd9acc7db37c1d36222ba8b",
    "data/tau2/domains/airline/policy.md": "10dc0525421521208be39cee235bba84a16e2bcba9899eb93d92cd81d2f62fc4",
    "data/tau2/domains/mock/db.json": "8661f80b4c693bb15ef2fe6781d24a5765240d61fc74387c770133953f9113ea",
    "data/tau2/domains/mock/tasks.json": "0d8bcd14798bf2e6e082432147f62570c57b0897b4e4e388c95bb02ecbe5d8cf",
    "data/tau2/domains/mock/split_tasks.json": "613c3298e6fd3cf03f71f848ecee519068eb4df54a1ceb28596f5aa443ee6581",
    "data/tau2/domains/mock/policy.md": "50ccbefac7c9ba77ce54131d61cfc6882f74b88ace66771115f9d867ec098203",
    "data/tau2/domains/telecom/db.toml": "562d647ef9d7df8df91eafd8ee76036e707c8f9e32aaedc4a7fde06975aea2c0",
    "data/tau2/domains/telecom/user_db.toml": "4886107ea0c16f8e16d74bef91cfb557de61822afe9361f5a9b241806aea2e4c",
    "data/tau2/domains/telecom/tasks.json": "37e562e1ae3242577407e1303b1548bc64e7ea68e37d36173e6747990ceaf8a4",
    "data/tau2/domains/telecom/split_tasks.json": "605b488bb9a6acb3c7f4505240a855fdc8681d09aadb16a8f38b2efcfc5c3aec",
    "data/tau2/domains/telecom/main_policy.md": "95943844a0cf11fdf0e2842b483b81d9f9338aa53235712ed131db075d086ed7",
    "data/tau2/domains/telecom/tech_support_manual.md": "015a3ee49ec8c199c5e1a059c922081937b92cf3a5ea74fedbc4357816f389ba",
    "data/tau2/user_simulator/simulation_guidelines.md": "740a29dfa64d7bc08eea3bf7493575b914a63f744acbaf7f199ee07eddaf72d3",
}


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
            "tau2-bench retail, airline, telecom and mock domains (MIT), pinned to a tau2-bench commit",
            commit=PINNED_COMMIT,
            sha256=SHA256,
            licence="MIT (Sierra Research, tau2-bench)",
        )
    )
