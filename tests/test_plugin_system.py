"""The plugin system as a third party uses it: resolution hooks, lazy loading, containment,
the import boundary, and the rule that every hook is documented and tested."""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from budgetbench_core import (
    Backend,
    Completion,
    Dataset,
    RunConfig,
    Tokenizer,
    TokenizerInfo,
    __all__ as PUBLIC,
    hookimpl,
    hookspecs,
    run,
)
from budgetbench_core.plugins import HOOKS, PluginError, PluginInfo, Registry, load_registry
from budgetbench_core.testing import FaultServer, invoke_cli

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "litellm", "sentence_transformers", "qdrant_client", "mem0", "llmlingua", "transformers")


# ----------------------------------------------------------------- a third-party plugin


class VendorBackend(Backend):
    """``--model myvendor/<name>``: an OpenAI-compatible vendor endpoint, spoken to directly."""

    name = "myvendor"

    def complete(self, messages, params):
        import httpx

        reply = httpx.post(
            f"{self.api_base}/chat/completions",
            timeout=30,
            json={"model": self.model.split("/", 1)[1], "messages": [m.to_chat() for m in messages]},
        )
        body = reply.json()
        return Completion(
            body["choices"][0]["message"]["content"],
            body["usage"]["prompt_tokens"],
            body["usage"]["completion_tokens"],
            0.0,
            model="myvendor",
        )


class VendorWords(Tokenizer):
    """``--tokenizer vendor-words``: a spec with no prefix at all, claimed by resolve_tokenizer."""

    info = TokenizerInfo("vendor-words", "test", exact=False)

    def render(self, messages):
        return "\n".join(f"{m.role}: {m.content}" for m in messages)

    def count_text(self, text):
        return len(text.split())


class VendorPlugin:
    """Everything a vendor adds with no change to the core."""

    @hookimpl
    def register_backends(self, register):
        register(VendorBackend)

    @hookimpl
    def resolve_backend(self, model):
        return "myvendor" if model.startswith("myvendor/") else None

    @hookimpl
    def resolve_tokenizer(self, spec, backend):
        return VendorWords() if spec == "vendor-words" else None

    @hookimpl
    def register_datasets(self, register):
        register(
            Dataset(
                "vendor-bench",
                "myvendor/vendor-bench",
                "vendor_bench",
                {"data/test.json": "test.json"},
                "The vendor's own benchmark",
            )
        )


def vendor_registry() -> Registry:
    registry = load_registry()
    registry.add_plugin(VendorPlugin(), PluginInfo("vendor", "budgetbench-vendor", "1.2.3"))
    return registry


def test_hook_resolve_backend_selects_a_plugin_backend_by_model_prefix(tmp_path):
    registry = vendor_registry()
    assert registry.resolve_backend("myvendor/big-model").obj is VendorBackend
    assert registry.resolve_backend("local").name == "local"  # built-ins keep theirs
    assert registry.resolve_backend("ollama_chat/qwen2.5:1.5b").name == "litellm"  # the catch-all is trylast
    with FaultServer() as server:
        summary = run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation"],
                budgets=[2048],
                limit=2,
                model="myvendor/big-model",
                api_base=server.url,
                tokenizer="vendor-words",
                out=tmp_path / "run",
                task_options={"items": 2, "history_tokens": 500},
            ),
            registry=registry,
        )
        assert summary.results == 2 and len(server.requests) == 2
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert "budgetbench-vendor" in json.dumps(manifest)


def test_hook_resolve_tokenizer_claims_a_spec_and_prefixes_still_work():
    registry = vendor_registry()
    assert isinstance(registry.resolve_tokenizer("vendor-words", None), VendorWords)
    assert registry.resolve_tokenizer("tiktoken:cl100k_base", None).info.id == "tiktoken:cl100k_base"
    with pytest.raises(PluginError, match="unknown tokenizer 'nope'.*tiktoken"):
        registry.resolve_tokenizer("nope:x", None)


def test_hook_register_datasets_is_what_data_fetch_knows(tmp_path, monkeypatch):
    registry = vendor_registry()
    monkeypatch.setattr("budgetbench_core.plugins._registry", registry)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("BUDGETBENCH_DATA_DIR", str(tmp_path))
    listing = invoke_cli("data", "fetch")
    assert listing.exit_code == 2 and "vendor-bench" in listing.output and "longmemeval" in listing.output
    offline = invoke_cli("data", "fetch", "vendor-bench")
    assert offline.exit_code == 1
    assert str(tmp_path / "vendor_bench" / "test.json") in offline.output
    assert "https://huggingface.co/datasets/myvendor/vendor-bench/resolve/main/data/test.json" in offline.output
    with pytest.raises(ValueError, match="must not contain folders"):
        Dataset("x", "a/b", "x", {"f.json": "../escape.json"})


# ----------------------------------------------------------------- containment and duplicates


def test_a_duplicate_name_is_an_error_naming_both_and_other_registrations_still_work():
    from budgetbench_core.builtin.strategies import Recency, Truncation

    class Mine(Truncation):
        name = "mine"

    registry = Registry()
    registry.add_plugin(
        types_plugin(register_strategies=lambda register: register(Truncation)), PluginInfo("first", "dist-first", "1")
    )
    second = PluginInfo("second", "dist-second", "1")
    registry.add_plugin(
        types_plugin(register_strategies=lambda register: [register(c) for c in (Truncation, Mine, Recency)]), second
    )
    with pytest.raises(PluginError, match="dist-first.*dist-second"):
        registry.get("strategy", "truncation")
    assert registry.get("strategy", "mine").plugin is second and registry.get("strategy", "recency").obj is Recency
    assert "registered twice" in second.error


def types_plugin(**hooks):
    import types

    return types.SimpleNamespace(**{name: hookimpl(function) for name, function in hooks.items()})


def fake_distribution(tmp_path: Path, name: str, source: str) -> dict:
    """An installed-looking distribution whose entry point is the module ``source``."""
    module = name.replace("-", "_")
    dist = tmp_path / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[budgetbench]\n{name} = {module}\n")
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def budgetbench(*args, env=None):
    script = Path(sys.executable).with_name("budgetbench")
    return subprocess.run([str(script), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize(
    "source, error",
    [
        ("import sys\nprint('hello from a plugin')\nsys.exit(3)\n", "SystemExit: 3"),
        (
            "import os\nos.write(1, b'raw bytes on fd 1')\nprint('chatty')\n"
            "from budgetbench_core import hookimpl\n@hookimpl\ndef register_strategies(register):\n"
            "    print('still chatty'); raise SystemExit(0)\n",
            "register_strategies raised SystemExit",
        ),
    ],
)
def test_a_plugin_that_exits_or_prints_cannot_silence_or_corrupt_list_plugins_json(tmp_path, source, error):
    env = fake_distribution(tmp_path, "hostile-plugin", source)
    result = budgetbench("list-plugins", "--json", env=env)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)  # stdout is exactly the JSON
    hostile = [r for r in rows if r["distribution"] == "hostile-plugin"]
    assert hostile and hostile[0]["kind"] == "error" and error in hostile[0]["error"]
    assert {"truncation", "synthetic-memory", "local"} <= {r["name"] for r in rows}
    assert "printed while loading" in result.stderr


# ----------------------------------------------------------------- lazy loading


def modules_after(*args: str) -> set[str]:
    code = (
        "import sys, io, contextlib\nsys.argv = ['budgetbench', *sys.argv[1:]]\n"
        "from budgetbench_core.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main()\n    except SystemExit:\n        pass\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


@pytest.mark.parametrize("args", [("--version",), ("--help",), ("report", "--help")])
def test_version_and_help_import_no_heavy_library(args):
    loaded = modules_after(*args)
    assert not [m for m in HEAVY if m in loaded], sorted(m for m in HEAVY if m in loaded)
    if args == ("--version",):  # nothing asked for a plugin: none is imported
        assert not [m for m in loaded if m.startswith("budgetbench_") and m.split(".")[0] != "budgetbench_core"]


def test_listing_reads_metadata_and_imports_only_on_use():
    """Declared plugins come from metadata alone; a lookup imports them (in a fresh process)."""
    declared = {p.name for p in Registry.discover().declared()}
    assert {"builtin-strategies", "task-longmemeval", "strategy-rag"} <= declared
    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import sys\nfrom budgetbench_core.plugins import Registry\nr = Registry.discover()\n"
                "names = [p.name for p in r.declared()]\n"
                "print(len(names), 'budgetbench_strategy_rag' in sys.modules)\n"
                "r.get('strategy', 'rag')\nprint('budgetbench_strategy_rag' in sys.modules)"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert fresh.returncode == 0, fresh.stderr
    first, after = fresh.stdout.splitlines()
    assert first.split()[1] == "False" and after == "True"


THIRD_PARTY = "sorted({m.split('.')[0] for m in sys.modules if m.startswith('budgetbench_') and m != 'budgetbench_core' and not m.startswith('budgetbench_core.')})"


def test_a_lookup_imports_only_its_plugin_and_the_wrappers_and_knows_failures_unimported(tmp_path):
    """The index (built in a child process) answers names, failures, versions and executor
    options; ``get`` imports the one entry point that registers the name plus every plugin that
    wraps a hook, and that wrapper sees the registration call."""
    fake_distribution(
        tmp_path,
        "wrapping-plugin",
        """
        from budgetbench_core import hookimpl

        CALLS = []

        @hookimpl(wrapper=True)
        def register_strategies(register):
            CALLS.append("register_strategies")
            return (yield)
        """,
    )
    env = fake_distribution(tmp_path, "broken-plugin", "raise ImportError('needs a library that is not installed')\n")
    code = f"""
import json, sys
from budgetbench_core.plugins import Registry
r = Registry.discover()
seen = dict(
    executors=r.names("executor"),
    ray_options=sorted(r.executor_options().get("ray", {{}})),
    failed={{p.name: p.error for p in r.failures}},
    versions=r.distributions(),
    imported={THIRD_PARTY},
)
r.get("strategy", "truncation")
import wrapping_plugin
seen.update(after={THIRD_PARTY}, calls=wrapping_plugin.CALLS)
import click
r.add_commands(click.Group())
targets = {{p.name: p.value.split(".")[0] for p in r.declared()}}
seen.update(with_commands={THIRD_PARTY}, adds_commands=sorted({{targets[n] for n in r.index()["commands"]}}))
print(json.dumps(seen))
"""
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # a fresh index, built in a child process
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["imported"] == [] and seen["after"] == [], seen  # wrapping_plugin is top-level, not budgetbench_
    assert {"thread", "ray"} <= set(seen["executors"]) and "address" in seen["ray_options"]
    assert "ImportError: needs a library that is not installed" in seen["failed"]["broken-plugin"]
    assert "budgetbench-strategy-rag" in seen["versions"] and "broken-plugin" not in seen["versions"]
    assert seen["calls"] == ["register_strategies"]  # builtin-strategies' one implementation, wrapped
    third_party = [m for m in seen["adds_commands"] if m != "budgetbench_core"]
    assert third_party and seen["with_commands"] == third_party  # only the plugins that add commands
    assert list((tmp_path / "cache" / "budgetbench").glob("plugin-index-*.json"))


def test_run_with_a_builtin_strategy_imports_no_third_party_plugin(tmp_path):
    """`run -s truncation` builds its command and runs from the plugin index: the executors' options
    (`--ray-address`) and the names it checks import no third-party distribution."""
    code = (
        "import sys, io, contextlib\nsys.argv = ['budgetbench', *sys.argv[1:]]\n"
        "from budgetbench_core.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main()\n    except SystemExit as exc:\n        print('exit', exc.code, file=sys.stderr)\n"
        f"print({THIRD_PARTY})\n"
    )
    args = ["run", "-t", "synthetic-memory", "-s", "truncation", "-b", "512", "-n", "1", "--prompts-only"]
    args += ["--tokenizer", "tiktoken:cl100k_base", "--task-option", "items=1", "--task-option", "history_tokens=300"]
    args += ["--display", "none", "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "exit 0" in done.stderr, done.stderr
    assert (tmp_path / "run" / "manifest.json").exists()
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_load_plugins_naming_no_entry_point_warns_with_the_valid_names():
    """A typo or a distribution's name in BUDGETBENCH_LOAD_PLUGINS is told, not silently ignored."""
    env = {**os.environ, "BUDGETBENCH_LOAD_PLUGINS": "builtin-strategies,strategy-rga,budgetbench-task-longmemeval"}
    result = budgetbench("list-plugins", "--json", env=env)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)  # the warning stays off stdout
    assert {r["plugin"] for r in rows} == {"builtin-strategies"}, rows
    warning = result.stderr
    assert "BUDGETBENCH_LOAD_PLUGINS" in warning
    assert "'strategy-rga' (did you mean 'strategy-rag'?)" in warning
    assert "'budgetbench-task-longmemeval' (a distribution, not an entry point; its entry point: task-longmemeval)" in (
        warning
    )
    valid = set(warning.split("Valid entry-point names: ", 1)[1].strip().split(", "))
    assert {"builtin-strategies", "strategy-rag", "task-longmemeval"} <= valid, warning
    assert "'builtin-strategies'" not in warning  # a valid name is not reported

    quiet = budgetbench("list-plugins", env={**os.environ, "BUDGETBENCH_LOAD_PLUGINS": "builtin-strategies"})
    assert quiet.returncode == 0 and "BUDGETBENCH_LOAD_PLUGINS" not in quiet.stderr, quiet.stderr


# ----------------------------------------------------------------- the import boundary


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def distribution_files() -> list[Path]:
    folders = list((ROOT / "plugins").glob("budgetbench-*"))
    return [p for folder in folders if folder.is_dir() for p in folder.rglob("*.py") if ".egg-info" not in str(p)]


def test_plugins_and_their_tests_import_only_the_public_api():
    problems = []
    for path in distribution_files():
        for module, names in _imports(path):
            if module == "budgetbench_core":
                problems += [f"{path.relative_to(ROOT)}: {n}" for n in names if n not in PUBLIC]
            elif module.startswith("budgetbench_core.") and module != "budgetbench_core.testing":
                problems.append(f"{path.relative_to(ROOT)}: {module}")
    assert not problems, "private core imports:\n" + "\n".join(problems)


def test_the_core_imports_no_plugin():
    plugin_packages = {
        p.parent.name
        for p in distribution_files()
        if p.name == "__init__.py" and p.parent.name.startswith("budgetbench_")
    }
    problems = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / "budgetbench_core").rglob("*.py")
        for module, _ in _imports(path)
        if module.split(".")[0] in plugin_packages
    ]
    assert plugin_packages and not problems, problems


# ----------------------------------------------------------------- every hook documented and tested


def test_every_hook_has_docs_with_its_signature_and_a_test():
    specs = {
        name
        for name in dir(hookspecs)
        if callable(getattr(hookspecs, name)) and hasattr(getattr(hookspecs, name), "budgetbench_spec")
    }
    assert specs == set(HOOKS)
    docs = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    tests = " ".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("test_*.py"))
    for name in sorted(specs):
        parameters = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert re.search(rf"^## `?{name}\({re.escape(parameters)}\)`?", docs, re.MULTILINE), (
            f"docs/hooks.md has no section '## {name}({parameters})'"
        )
        assert re.search(rf"def test_hook_{name}[_(]", tests), f"no test_hook_{name}"


# ----------------------------------------------------------------- shared data under CI


def test_ci_turns_a_shared_data_skip_into_a_failure(tmp_path):
    """Locally a test without ../shared/data is skipped; under CI=true it fails, whether it
    asked through ``shared_data`` or skipped with a reason naming the folder."""
    (tmp_path / "test_needs_data.py").write_text(
        textwrap.dedent("""
        import pytest
        from budgetbench_core.testing import SHARED_DATA, shared_data

        def test_helper():
            shared_data("no-such-corpus/file.json")

        @pytest.mark.skipif(True, reason=f"data not found in {SHARED_DATA / 'no-such-corpus'}")
        def test_marker():
            pass

        def test_other_skip():
            pytest.skip("no GPU here")
        """)
    )

    def outcomes(ci: str) -> str:
        env = {**os.environ, "CI": ci}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            cwd=tmp_path,
        )
        return done.stdout

    local, ci = outcomes(""), outcomes("true")
    assert "3 skipped" in local
    assert "FAILED" in ci and "test_helper" in ci and "ERROR" in ci and "test_marker" in ci
    assert "SKIPPED" in ci and "no GPU here" in ci  # an unrelated skip stays a skip
