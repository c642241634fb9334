"""One test per hook: a plugin module registers through it and the registry serves it."""

from __future__ import annotations

import types

import click
import pytest
from click.testing import CliRunner

from budgetbench_core import (
    Backend,
    Completion,
    Grader,
    Item,
    MemoryStrategy,
    Message,
    Regime,
    Task,
    Tokenizer,
    TokenizerInfo,
    Verdict,
    hookimpl,
)
from budgetbench_core.plugins import PluginError, PluginInfo, Registry, load_registry
from budgetbench_core.runner import RunConfig, run


def plugin(name: str, **hooks) -> tuple[types.SimpleNamespace, PluginInfo]:
    module = types.SimpleNamespace(**{k: hookimpl(v) for k, v in hooks.items()})
    return module, PluginInfo(name, f"dist-{name}", "0.0.1")


class KeepFirst(MemoryStrategy):
    """Keeps only the oldest message: easy to recognise in the audit."""

    name = "keep-first"
    regime = Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        return context.frame(list(history[:1]))


class TwoItems(Task):
    name = "two-items"
    default_grader = "exact-match"
    max_output_tokens = 8

    def load(self, limit, seed):
        for index in range(2):
            yield Item(
                id=f"i{index}",
                history=(Message("user", f"The code word is tulip{index}."),),
                query=Message("user", "Reply with the code word only."),
                answer=f"tulip{index}",
                system=Message("system", "Be brief."),
                category="probe",
            )


def test_hook_register_strategies(tmp_path):
    registry = load_registry()
    registry.add_plugin(*plugin("strategies", register_strategies=lambda register: register(KeepFirst)))
    entry = registry.get("strategy", "keep-first")
    assert entry.obj is KeepFirst and entry.plugin.distribution == "dist-strategies"
    summary = run(
        RunConfig(
            task="synthetic-memory",
            strategies=["keep-first"],
            budgets=[400],
            limit=1,
            out=tmp_path,
            task_options={"items": 1, "history_tokens": 400},
        ),
        registry=registry,
    )
    assert summary.results == 1
    audit = next(p for p in (tmp_path / "cells").rglob("*.jsonl")).read_text()
    assert "prompt_audit" in audit


def test_hook_register_tasks(tmp_path):
    registry = load_registry()
    registry.add_plugin(*plugin("tasks", register_tasks=lambda register: register(TwoItems)))
    summary = run(
        RunConfig(task="two-items", strategies=["truncation"], budgets=[256], out=tmp_path), registry=registry
    )
    assert summary.results == 2 and summary.errors == 0


class AlwaysHalf(Grader):
    name = "always-half"
    binary = False

    def grade(self, item, prediction, context):
        return Verdict(0.5 if prediction else 0.0, {"seen": prediction})


def test_hook_register_graders(tmp_path):
    registry = load_registry()
    registry.add_plugin(*plugin("graders", register_graders=lambda register: register(AlwaysHalf)))
    registry.add_plugin(*plugin("tasks", register_tasks=lambda register: register(TwoItems)))
    run(
        RunConfig(task="two-items", strategies=["truncation"], budgets=[256], grader="always-half", out=tmp_path),
        registry=registry,
    )
    from budgetbench_core.runlog import final_rows

    rows = list(final_rows(tmp_path).values())
    assert len(rows) == 2
    assert all(r["grader"]["name"] == "always-half" and r["verdict"]["seen"] == r["prediction"] for r in rows)


class LocalWithLabel(Backend):
    """Delegates to the embedded backend, adding a label, to prove the registry picks it.

    Registered beside the built-ins (nothing is replaced) and selected by its own
    ``--model labelled/...`` prefix through ``resolve_backend``.
    """

    name = "labelled"

    def __init__(self, model, **options):
        super().__init__(model, **options)
        from budgetbench_core.builtin.local_backend import LocalBackend

        self.inner = LocalBackend(max_concurrency=1)

    def start(self):
        self.inner.start()
        self.server_url = self.inner.server_url

    def stop(self):
        self.inner.stop()

    def default_tokenizer(self):
        return "server"

    def complete(self, messages, params):
        completion = self.inner.complete(messages, params)
        return Completion(**{**completion.__dict__, "model": "labelled"})


def test_hook_register_backends(tmp_path):
    registry = load_registry()
    registry.add_plugin(
        *plugin(
            "backends",
            register_backends=lambda register: register(LocalWithLabel),
            resolve_backend=lambda model: "labelled" if model.startswith("labelled/") else None,
        )
    )
    registry.add_plugin(*plugin("tasks", register_tasks=lambda register: register(TwoItems)))
    assert registry.names("backend") == ["labelled", "litellm", "local"]
    summary = run(
        RunConfig(task="two-items", strategies=["truncation"], budgets=[256], model="labelled/model", out=tmp_path),
        registry=registry,
    )
    assert summary.results == 2 and summary.model_calls == 2
    from budgetbench_core.runlog import read_manifest

    assert read_manifest(tmp_path)["model"]["backend"] == "labelled"


class WordTokenizer(Tokenizer):
    """Counts words: an approximate tokenizer, labelled as such on every row."""

    info = TokenizerInfo("words", "test", exact=False)

    def render(self, messages):
        return "\n".join(f"{m.role}: {m.content}" for m in messages)

    def count_text(self, text):
        return len(text.split())


def test_hook_register_tokenizers(tmp_path):
    registry = load_registry()
    registry.add_plugin(
        *plugin(
            "tokenizers", register_tokenizers=lambda register: register("words", lambda arg, backend: WordTokenizer())
        )
    )
    registry.add_plugin(*plugin("tasks", register_tasks=lambda register: register(TwoItems)))
    run(
        RunConfig(task="two-items", strategies=["truncation"], budgets=[256], tokenizer="words", out=tmp_path),
        registry=registry,
    )
    from budgetbench_core.runlog import final_rows, iter_events

    rows = list(final_rows(tmp_path).values())
    assert {r["tokenizer"]["id"] for r in rows} == {"words"}
    assert all(r["tokenizer"]["exact"] is False for r in rows)
    for audit in (e for e in iter_events(tmp_path) if e["event"] == "prompt_audit"):
        messages = [Message.from_dict(m) for m in audit["messages"]]
        assert audit["prompt_tokens"] == WordTokenizer().count(messages)


def test_hook_register_commands():
    registry = Registry()
    module, info = plugin("commands")

    def register_commands(cli):
        @cli.command()
        def hello():
            click.echo("hello from a plugin")

    module.register_commands = hookimpl(register_commands)
    registry.add_plugin(module, info)

    @click.group()
    def group():
        pass

    registry.add_commands(group)
    result = CliRunner().invoke(group, ["hello"])
    assert result.exit_code == 0 and "hello from a plugin" in result.output
    assert info.hooks == ["register_commands"]


def test_duplicate_name_names_both_distributions():
    registry = Registry()
    registry.add_plugin(*plugin("one", register_strategies=lambda register: register(KeepFirst)))
    registry.add_plugin(*plugin("two", register_strategies=lambda register: register(KeepFirst)))
    with pytest.raises(PluginError, match="dist-one.*dist-two"):
        registry.get("strategy", "keep-first")
    assert "registered twice" in registry.plugins[1].error


def test_wrong_registration_type_is_reported_not_fatal():
    registry = Registry()
    registry.add_plugin(*plugin("bad", register_strategies=lambda register: register(object)))
    registry.add_plugin(*plugin("good", register_tasks=lambda register: register(TwoItems)))
    assert "not a subclass" in registry.plugins[0].error
    assert registry.get("task", "two-items").obj is TwoItems


def test_unknown_name_lists_available():
    registry = load_registry()
    with pytest.raises(PluginError, match="available: .*truncation"):
        registry.get("strategy", "no-such-strategy")


# ----------------------------------------------------------------- how hooks are called


def module_plugin(name: str, *functions) -> tuple[types.ModuleType, PluginInfo]:
    """A real plugin module holding ``functions`` under their own names (a specname may differ)."""
    module = types.ModuleType(f"{name.replace('-', '_')}_plugin")
    for function in functions:
        setattr(module, function.__name__, function)
    return module, PluginInfo(name, f"dist-{name}", "0.0.1")


def test_a_specname_implementation_registers_and_is_reported():
    @hookimpl(specname="register_strategies")
    def add_my_strategies(register):
        register(KeepFirst)

    registry = Registry()
    module, info = module_plugin("specname", add_my_strategies)
    registry.add_plugin(module, info)
    assert registry.get("strategy", "keep-first").plugin is info
    assert info.hooks == ["register_strategies"] and info.error is None


def test_each_implementation_is_contained_and_blamed_on_its_own():
    @hookimpl
    def register_strategies(register):
        raise RuntimeError("broken on purpose")

    @hookimpl(specname="register_strategies")
    def more_strategies(register):
        register(KeepFirst)

    registry = Registry()
    module, info = module_plugin("two-impls", register_strategies, more_strategies)
    registry.add_plugin(module, info)
    assert registry.get("strategy", "keep-first").plugin is info  # the other implementation still ran
    assert "register_strategies raised RuntimeError: broken on purpose" in info.error


def test_an_implementation_of_no_hook_is_reported_not_silently_ignored():
    @hookimpl
    def register_strategy(register):  # the typo of register_strategies
        register(KeepFirst)

    registry = Registry()
    module, info = module_plugin("typo", register_strategy)
    registry.add_plugin(module, info)
    assert "'register_strategy' is no budgetbench hook" in info.error
    assert registry.registered("strategy", "keep-first") is None


class Recorder:
    """Wraps a registration hook (new style) and a resolution hook (old style), recording each call."""

    def __init__(self) -> None:
        self.calls: list = []

    @hookimpl(wrapper=True)
    def register_strategies(self, register):
        self.calls.append("start")
        try:
            return (yield)
        finally:
            self.calls.append("end")

    @hookimpl(hookwrapper=True)
    def resolve_backend(self, model):
        outcome = yield
        self.calls.append((model, outcome.get_result()))


def test_a_wrapper_sees_every_call_of_every_implementation():
    recorder = Recorder()
    registry = Registry()
    registry.add_plugin(recorder, PluginInfo("recorder", "dist-recorder", "0.0.1"))
    assert recorder.calls == []  # a plugin with only wrappers is never called itself

    class Other(KeepFirst):
        name = "other"

    first = plugin("first", register_strategies=lambda register: register(KeepFirst))
    second = plugin("second", register_strategies=lambda register: register(Other))
    registry.add_plugin(*first)
    registry.add_plugin(*second)
    assert recorder.calls == ["start", "end", "start", "end"]  # one call per plugin, each wrapped
    assert registry.get("strategy", "other").plugin is second[1]  # attribution is kept

    def broken(register):
        raise RuntimeError("broken on purpose")

    failing = plugin("failing", register_strategies=broken)
    registry.add_plugin(*failing)
    assert recorder.calls[-2:] == ["start", "end"]  # the wrapper sees the failing call too
    assert "register_strategies (inside the wrappers of recorder) raised RuntimeError" in failing[1].error

    recorder.calls.clear()

    @hookimpl(tryfirst=True)
    def resolve_backend(model):
        return None  # asked first, declines

    registry.add_plugin(*module_plugin("declines", resolve_backend))
    registry.add_plugin(
        *plugin(
            "backends",
            register_backends=lambda register: register(LocalWithLabel),
            resolve_backend=lambda model: "labelled" if model.startswith("labelled/") else None,
        )
    )
    assert registry.resolve_backend("labelled/m").obj is LocalWithLabel
    assert recorder.calls == [("labelled/m", None), ("labelled/m", "labelled")]


def test_a_blocked_name_is_refused_and_reported():
    registry = Registry(blocked={"vendor"})
    module, info = plugin("vendor", register_strategies=lambda register: register(KeepFirst))
    registry.add_plugin(module, info)
    assert "blocked by BUDGETBENCH_LOAD_PLUGINS" in info.error
    assert registry.registered("strategy", "keep-first") is None
