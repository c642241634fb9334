"""What a plugin accepts: strategy parameters and task options, checked before a run starts.

A parameter is accepted when the plugin declares it. Two ways to declare, merged:

- the constructor's signature: every keyword parameter of ``__init__``, following
  ``**params`` up the class hierarchy to the contract base (``MemoryStrategy``,
  ``MemorySystem``, ``Task``, ``Grader``), whose ``**params`` only records them;
- a class attribute ``parameters = {"name": Param(default, "help")}`` for what the
  signature cannot show (values read from ``**params``), and to give help text; a ``Param``
  may also declare ``type`` (``int``, ``float``, ``str``, ``bool``) and an inclusive
  ``minimum``/``maximum``, checked with the names before a run builds anything.

Without declared help, the help is the docstring sentence that mentions ````name````.
An unknown key is an error listing the accepted ones, with a "did you mean".
"""

from __future__ import annotations

import difflib
import inspect
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .graders import Grader
from .memory_systems import MemorySystem
from .plugins import Registry, UnknownNameError
from .strategies import MemoryStrategy
from .tasks import Task

_CONTRACT_BASES = (MemoryStrategy, MemorySystem, Task, Grader)


class _Required:
    def __repr__(self) -> str:
        return "required"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    """A declared parameter: its default (``REQUIRED`` if it has none), one line of help, and
    optionally the ``type`` and inclusive ``minimum``/``maximum`` a given value must have."""

    default: Any = REQUIRED
    help: str = ""
    type: type | None = None
    minimum: float | None = None
    maximum: float | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not acceptable (``"a number from 0 to 1"``-style), or None."""
        expected = self.type
        if expected is not None:
            if expected is float:
                ok = isinstance(value, int | float) and not isinstance(value, bool)
            elif expected is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            else:
                ok = isinstance(value, expected)
            if not ok:
                return f"must be {self.describe_range()}, got {value!r} ({type(value).__name__})"
        if self.minimum is not None or self.maximum is not None:
            try:
                low = self.minimum is not None and value < self.minimum
                high = self.maximum is not None and value > self.maximum
            except TypeError:
                return f"must be {self.describe_range()}, got {value!r}"
            if low or high:
                return f"must be {self.describe_range()}, got {value!r}"
        return None

    def describe_range(self) -> str:
        names: dict[type, str] = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
        if self.type is None:
            kind = "a value"
        else:
            kind = names.get(self.type, f"a {self.type.__name__}")
        if self.minimum is not None and self.maximum is not None:
            return f"{kind} from {self.minimum:g} to {self.maximum:g}"
        if self.minimum is not None:
            return f"{kind} >= {self.minimum:g}"
        if self.maximum is not None:
            return f"{kind} <= {self.maximum:g}"
        return kind


@dataclass(frozen=True)
class ParamSpec:
    """One accepted parameter as shown by ``describe`` and ``list-plugins --json``."""

    name: str
    default: Any
    required: bool
    help: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "default": _jsonable(self.default), "required": self.required, "help": self.help}


class ParameterError(UnknownNameError):
    """A key the plugin does not accept, or a required one missing; the message names the fix."""


def _jsonable(value: Any) -> Any:
    if value is REQUIRED:
        return None
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _doc_help(cls: type[object], name: str, names: list[str]) -> str:
    """From the docstring (of the class or its ``__init__``): the sentence mentioning ````name````,
    or, when the sentence lists other parameters too, the clause from this one to the next."""
    for doc in (inspect.getdoc(cls), inspect.getdoc(cls.__init__)):
        text = " ".join((doc or "").split())
        for sentence in re.split(r"(?<=\.)\s+(?=[A-Z`])", text):
            start = sentence.find(f"``{name}``")
            if start < 0:
                continue
            others = [sentence.find(f"``{other}``") for other in names if other != name]
            following = [i for i in others if i > start]
            if any(i >= 0 for i in others):
                clause = sentence[start : min(following)] if following else sentence[start:]
                clause = re.sub(r"[,;.]?\s*(and|or)?\s*$", "", clause)
            else:
                clause = sentence
            clause = clause.replace("``", "").strip()
            return clause if len(clause) <= 160 else clause[:157] + "..."
    return ""


def parameters_of(cls: type) -> dict[str, ParamSpec]:
    """Every parameter ``cls`` accepts, in declaration order."""
    found: dict[str, tuple[Any, str]] = {}
    for klass in cls.__mro__:
        if klass in _CONTRACT_BASES or klass is object:
            break
        init = klass.__dict__.get("__init__")
        if init is None:
            continue  # inherited: the parent's signature is what runs
        try:
            signature = inspect.signature(init)
        except (TypeError, ValueError):
            break
        forwards = False
        for parameter in list(signature.parameters.values())[1:]:  # skip self
            if parameter.kind is parameter.VAR_KEYWORD:
                forwards = True
            elif parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                default = REQUIRED if parameter.default is parameter.empty else parameter.default
                found.setdefault(parameter.name, (default, ""))
        if not forwards:
            break
    declared = getattr(cls, "parameters", None)
    if isinstance(declared, Mapping):
        for name, value in declared.items():
            param = value if isinstance(value, Param) else Param(help=str(value))
            default = param.default if param.default is not REQUIRED else found.get(name, (REQUIRED, ""))[0]
            found[name] = (default, param.help)
    return {
        name: ParamSpec(name, default, default is REQUIRED, help or _doc_help(cls, name, list(found)))
        for name, (default, help) in found.items()
    }


def did_you_mean(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def check_params(kind: str, name: str, cls: type, given: Mapping[str, Any], option: str) -> None:
    """Raise ParameterError for a key ``cls`` does not accept or a required one not given.

    ``option`` is how the user passes them (``--strategy-param checkpoint.KEY=VALUE``).
    """
    accepted = parameters_of(cls)
    for key in given:
        if key not in accepted:
            listing = ", ".join(accepted) or "none"
            raise ParameterError(
                f"{kind} {name!r} has no parameter {key!r}; {did_you_mean(key, list(accepted))}"
                f"accepted: {listing} (see `budgetbench describe {name}`)"
            )
    declared = getattr(cls, "parameters", None)
    if isinstance(declared, Mapping):
        for key, value in given.items():
            param = declared.get(key)
            problem = param.problem(value) if isinstance(param, Param) else None
            if problem:
                raise ParameterError(
                    f"{kind} {name!r}: parameter {key} {problem}; pass {option.replace('KEY', key)} "
                    f"(see `budgetbench describe {name}`)"
                )
    missing = [p.name for p in accepted.values() if p.required and p.name not in given]
    if missing:
        raise ParameterError(f"{kind} {name!r} needs {', '.join(missing)}: pass {option.replace('KEY', missing[0])}")


def resolve(registry: Registry, kind: str, name: str):
    """``registry.get`` with a "did you mean" when the name is unknown."""
    if name not in registry.names(kind):  # from the index: nothing is imported to ask
        hint = did_you_mean(name, registry.names(kind))
        if hint:
            raise UnknownNameError(f"unknown {kind} {name!r}; {hint}available: {', '.join(registry.names(kind))}")
    return registry.get(kind, name)


def check_run(
    registry: Registry,
    task: str,
    task_options: Mapping[str, Any],
    strategies: list[str],
    strategy_params: Mapping[str, Mapping[str, Any]],
    grader: str | None = None,
) -> None:
    """Names and parameters of a run, checked before anything is built."""
    task_class = resolve(registry, "task", task).obj
    check_params("task", task, task_class, task_options, "--task-option KEY=VALUE")
    for strategy in strategies:
        cls = resolve(registry, "strategy", strategy).obj
        check_params(
            "strategy", strategy, cls, strategy_params.get(strategy, {}), f"--strategy-param {strategy}.KEY=VALUE"
        )
    for strategy in strategy_params:
        if strategy not in strategies:
            raise ParameterError(
                f"--strategy-param names {strategy!r}, which is not in this run's strategies "
                f"({', '.join(strategies)}); {did_you_mean(strategy, list(strategies))}"
                f"add -s {strategy} or fix the prefix"
            )
    resolve(registry, "grader", grader or task_class.default_grader)
