"""A domain folder in the upstream layout, read unchanged, and fresh environments from it.

The layout is tau2-bench's ``data/tau2/domains/<domain>/``: ``db.json`` (or ``db.toml``),
``tasks.json``, ``split_tasks.json`` and ``policy.md``; mock also has ``user_db.json`` (the
user's inbox; when the folder lacks it, the copy of upstream's shipped in this package is
used). Telecom has ``db.toml``, ``user_db.toml`` (the user's phone) and, instead of
``policy.md``, ``main_policy.md`` plus ``tech_support_manual.md``, joined as upstream does.

The database file is parsed once per process and validated into new records for
every environment, so each episode starts from the same fresh state.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from budgetbench_core import TaskDataError

from .airline import AirlineTools
from .environment import Environment
from .mock import MockTools, MockUserTools
from .models import FlightDB, MockDB, MockUserDB, RetailDB
from .retail import RetailTools
from .telecom import TelecomTools
from .telecom_models import TelecomDB, TelecomUserDB
from .telecom_user import TelecomUserTools, sync
from .toolkit import Toolkit

DOMAINS: dict[str, tuple[type, type, tuple[type, type] | None]] = {
    "retail": (RetailDB, RetailTools, None),
    "airline": (FlightDB, AirlineTools, None),
    "mock": (MockDB, MockTools, (MockUserDB, MockUserTools)),
    "telecom": (TelecomDB, TelecomTools, (TelecomUserDB, TelecomUserTools)),
}
SYNC = {"telecom": sync}  # upstream's sync_tools, where a domain has one
TELECOM_POLICY = ("main_policy.md", "tech_support_manual.md")
PINNED_COMMIT = "a2c024725189473d2d7cea3a5cfdbcc67478e41f"  # the tau2-bench commit the data and semantics follow
PACKAGED_MOCK_USER_DB = Path(__file__).parent / "data" / "mock_user_db.json"
REWARD_TYPES = ("DB", "ENV_ASSERTION", "NL_ASSERTION", "ACTION", "COMMUNICATE")


def _read(path: Path) -> Any:
    try:
        if path.suffix == ".toml":
            return tomllib.loads(path.read_text(encoding="utf-8"))
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TaskDataError(f"{path}: not a readable {path.suffix[1:].upper()} file ({exc})") from None


@lru_cache(maxsize=8)
def _raw_database(path: str) -> Any:
    return _read(Path(path))


@dataclass(frozen=True)
class Action:
    """A gold action: a tool call by ``requestor`` (assistant or user)."""

    action_id: str
    name: str
    arguments: dict[str, Any]
    requestor: str = "assistant"
    compare_args: tuple[str, ...] | None = None

    def matches(self, name: str, arguments: dict[str, Any]) -> bool:
        """Upstream's ``compare_with_tool_call``: with no ``compare_args``, the call's own argument
        names are compared (so a call that omits an argument can still match)."""
        if name != self.name:
            return False
        keys = list(arguments) if self.compare_args is None else list(self.compare_args)
        if not keys:
            return True
        return {k: v for k, v in arguments.items() if k in keys} == {
            k: v for k, v in self.arguments.items() if k in keys
        }


@dataclass(frozen=True)
class TaskRecord:
    """One task of ``tasks.json``: the user's scenario, the initial state and the grading criteria."""

    id: str
    raw: dict[str, Any]
    criteria: dict[str, Any] | None
    actions: tuple[Action, ...] | None
    reward_basis: tuple[str, ...]
    initial_state: dict[str, Any] | None = field(default=None)

    @property
    def communicate_info(self) -> list[str]:
        return list((self.criteria or {}).get("communicate_info") or [])

    @property
    def nl_assertions(self) -> list[str]:
        return list((self.criteria or {}).get("nl_assertions") or [])

    @property
    def env_assertions(self) -> list[dict[str, Any]] | None:
        return None if self.criteria is None else self.criteria.get("env_assertions")

    @property
    def scenario(self) -> dict[str, Any]:
        return self.raw.get("user_scenario") or {}


def _task(path: Path, index: int, row: Any) -> TaskRecord:
    where = f"{path}: task {index}"
    if not isinstance(row, dict):
        raise TaskDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if not isinstance(row.get("id"), str) or not row["id"]:
        raise TaskDataError(f"{where}: field 'id' must be a non-empty string")
    where = f"{path}: task {row['id']!r}"
    scenario = row.get("user_scenario")
    if not isinstance(scenario, dict) or "instructions" not in scenario:
        raise TaskDataError(f"{where}: field 'user_scenario.instructions' is missing")
    criteria = row.get("evaluation_criteria")
    actions = None
    basis: tuple[str, ...] = ()
    if criteria is not None:
        if not isinstance(criteria, dict):
            raise TaskDataError(f"{where}: field 'evaluation_criteria' must be an object")
        if criteria.get("actions") is not None:
            parsed = []
            for number, action in enumerate(criteria["actions"]):
                if (
                    not isinstance(action, dict)
                    or not isinstance(action.get("name"), str)
                    or not isinstance(action.get("arguments"), dict)
                ):
                    raise TaskDataError(
                        f"{where}: evaluation_criteria.actions[{number}] needs a string 'name' and "
                        f"an object 'arguments'"
                    )
                compare = action.get("compare_args")
                parsed.append(
                    Action(
                        str(action.get("action_id", number)),
                        action["name"],
                        action["arguments"],
                        action.get("requestor") or "assistant",
                        None if compare is None else tuple(compare),
                    )
                )
            actions = tuple(parsed)
        basis = tuple(criteria.get("reward_basis") or ("DB", "COMMUNICATE"))
        unknown = sorted(set(basis) - set(REWARD_TYPES))
        if unknown:
            raise TaskDataError(
                f"{where}: evaluation_criteria.reward_basis has unknown entries {unknown}; known: {list(REWARD_TYPES)}"
            )
    return TaskRecord(row["id"], row, criteria, actions, basis, row.get("initial_state"))


@dataclass
class Domain:
    """One domain folder: policy, tasks, splits, and environments on demand."""

    name: str
    folder: Path
    policy: str
    tasks: list[TaskRecord]
    splits: dict[str, list[str]]
    db_path: Path
    user_db_path: Path | None
    _pristine_hashes: tuple[str, str | None] | None = field(default=None, repr=False)
    gold_cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def task(self, task_id: str) -> TaskRecord:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(task_id)

    def split(self, name: str) -> list[TaskRecord]:
        if name not in self.splits:
            raise TaskDataError(
                f"{self.folder / 'split_tasks.json'}: no split {name!r}; the splits are {sorted(self.splits)}"
            )
        wanted = set(self.splits[name])
        return [task for task in self.tasks if task.id in wanted]

    def _toolkits(self) -> tuple[Toolkit, Toolkit | None]:
        db_model, tools_class, user = DOMAINS[self.name]
        tools = tools_class(db_model.model_validate(_raw_database(str(self.db_path))))
        user_tools = None
        if user is not None:
            user_db_model, user_tools_class = user
            user_tools = user_tools_class(user_db_model.model_validate(_raw_database(str(self.user_db_path))))
        return tools, user_tools

    def _pristine(self) -> tuple[str, str | None]:
        if self._pristine_hashes is None:
            self._pristine_hashes = Environment(self._toolkits).snapshot()
        return self._pristine_hashes

    def environment(self) -> Environment:
        """A fresh environment: the database as in the file, nothing applied."""
        return Environment(self._toolkits, self._pristine, SYNC.get(self.name))


def _policy(name: str, folder: Path) -> str:
    """The agent's policy; telecom's is the main policy and the tech-support manual, tagged as upstream."""
    if name != "telecom":
        return (folder / "policy.md").read_text(encoding="utf-8")
    main, manual = ((folder / f).read_text(encoding="utf-8") for f in TELECOM_POLICY)
    return f"<main_policy>\n{main}\n</main_policy>\n<tech_support_policy>\n{manual}\n</tech_support_policy>"


def load_domain(name: str, folder: str | Path) -> Domain:
    """Read ``folder`` (upstream layout) for domain ``name``; errors name the file and field."""
    if name not in DOMAINS:
        raise TaskDataError(f"tau-bench: unknown domain {name!r}; known: {', '.join(DOMAINS)}")
    folder = Path(folder)
    db_path = next((folder / f for f in ("db.json", "db.toml") if (folder / f).is_file()), None)
    policy_files = TELECOM_POLICY if name == "telecom" else ("policy.md",)
    needed = ("tasks.json", *policy_files, *(("user_db.toml",) if name == "telecom" else ()))
    missing = [f for f in needed if not (folder / f).is_file()]
    if db_path is None:
        missing.insert(0, "db.json (or db.toml)")
    if missing:
        raise TaskDataError(
            f"tau-bench {name}: {folder} lacks {', '.join(missing)}. Run `budgetbench data fetch tau-bench`, "
            f"or pass --task-option path=<folder> holding the files of data/tau2/domains/{name}/ in "
            f"https://github.com/sierra-research/tau2-bench (commit {PINNED_COMMIT})."
        )
    rows = _read(folder / "tasks.json")
    if not isinstance(rows, list):
        raise TaskDataError(f"{folder / 'tasks.json'}: expected a JSON list of tasks, got {type(rows).__name__}")
    tasks = [_task(folder / "tasks.json", index, row) for index, row in enumerate(rows)]
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise TaskDataError(f"{folder / 'tasks.json'}: task id {task.id!r} appears twice")
        seen.add(task.id)
    split_file = folder / "split_tasks.json"
    splits = _read(split_file) if split_file.is_file() else {"base": [t.id for t in tasks]}
    if not isinstance(splits, dict) or not all(isinstance(v, list) for v in splits.values()):
        raise TaskDataError(f"{split_file}: expected an object mapping split names to lists of task ids")
    for split, ids in splits.items():
        unknown = sorted(set(ids) - seen)
        if unknown:
            raise TaskDataError(f"{split_file}: split {split!r} names unknown task ids {unknown[:5]}")
    user_db_path = None
    if name == "telecom":
        user_db_path = folder / "user_db.toml"
    elif DOMAINS[name][2] is not None:
        user_db_path = folder / "user_db.json" if (folder / "user_db.json").is_file() else PACKAGED_MOCK_USER_DB
    domain = Domain(name, folder, _policy(name, folder), tasks, splits, db_path, user_db_path)
    try:
        _ = domain.environment().tools  # building the tools validates the database against the schema
    except TaskDataError:
        raise
    except Exception as exc:  # a database that does not fit the schema
        raise TaskDataError(f"{db_path}: does not match the {name} database schema: {exc}") from None
    return domain
