"""The core's shape, held by tests: no import cycle anywhere in ``budgetbench_core``, and the
engine (what runs a cell) never reaches back to the runner or the CLI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import budgetbench_core

CORE = Path(budgetbench_core.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path) -> set[str]:
    """Every core module ``path`` imports, at any depth of its code (a function's lazy import
    is still a dependency), except under ``if TYPE_CHECKING``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            return
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                found.add(f"{module}.{alias.name}")
                found.add(module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def core_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in CORE.rglob("*.py") if "plugin_template" not in p.parts}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a package importing its own submodules excepted), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def edges(name: str) -> set[str]:
        return {m for m in graph[name] if not m.startswith(name + ".") and not name.startswith(m + ".")}

    def walk(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for target in sorted(edges(name)):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := walk(target)):
                return found
        stack.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := walk(name)):
            return found
    return None


def test_the_core_has_no_import_cycle():
    cycle = _cycle(core_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one():
    """The check above can fail: a graph with a cycle is reported with its path."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_engine_never_imports_the_runner_or_the_cli():
    graph = core_graph()
    engine = [name for name in graph if name.startswith("budgetbench_core.engine")]
    assert engine, "no engine modules found"
    forbidden = {"budgetbench_core.runner", "budgetbench_core.cli", "budgetbench_core.demo"}
    reached = {name: sorted(graph[name] & forbidden) for name in engine if graph[name] & forbidden}
    assert not reached, reached


def test_no_module_reads_the_runs_attributes():
    """Cells are given their services, never the ``Run``: no other module names it."""
    readers = [
        _module_name(p)
        for p in CORE.rglob("*.py")
        if p.name != "runner.py" and "budgetbench_core.runner.Run" in _imports(p)
    ]
    assert not readers, readers


def test_run_with_a_builtin_strategy_imports_no_third_party_plugin(tmp_path):
    """``run -s truncation`` (prompts only) loads the plugins it uses and no other distribution's module."""
    script = (
        "import sys\n"
        "from budgetbench_core.testing import invoke_cli\n"
        f"result = invoke_cli('run', '-t', 'synthetic-memory', '-s', 'truncation', '-b', '512', '-n', '2',"
        f" '--prompts-only', '-o', {str(tmp_path / 'run')!r})\n"
        "assert result.exit_code == 0, result.output\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith('budgetbench_') "
        "and not m.startswith('budgetbench_core')}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
