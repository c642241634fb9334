"""The documentation site builds with `mkdocs build --strict`, and documents every hook and command."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from budgetbench_core import hookspecs
from budgetbench_core.cli import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def hook_names() -> list[str]:
    return [
        name
        for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(function, "budgetbench_spec")
    ]


def is_core(command: click.Command) -> bool:
    """Plugins' commands (added to the group once a plugin command is used) live on the plugin's page."""
    module = getattr(command.callback, "__module__", "") or ""
    return module.startswith("budgetbench_core")


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, command in sorted(group.commands.items()):
        if not is_core(command):
            continue
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += command_paths(command, (*prefix, name))
    return paths


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


def test_site_builds_strict_with_every_page(site):
    """Strict mode turns a broken link or a page left out of the navigation into a failure."""
    for page in DOCS.rglob("*.md"):
        relative = page.relative_to(DOCS).with_suffix("")
        built = site / (
            "index.html"
            if relative.name == "index" and relative.parent == Path(".")
            else relative.parent / ("" if relative.name == "index" else relative.name) / "index.html"
        )
        assert built.is_file(), f"{page} was not built"


def test_every_hook_has_a_section():
    sections = set(re.findall(r"^## (\w+)", (DOCS / "hooks.md").read_text(encoding="utf-8"), flags=re.M))
    hooks = hook_names()
    assert len(hooks) >= 6
    missing = sorted(set(hooks) - sections)
    assert not missing, f"hooks without a section in docs/hooks.md: {missing}"


def test_cli_reference_lists_every_command(site):
    html = (site / "cli" / "index.html").read_text(encoding="utf-8")
    for path in command_paths(cli):
        anchor = "-".join(("budgetbench", *path))
        assert f'id="{anchor}"' in html, f"`budgetbench {' '.join(path)}` missing from the CLI reference"
    assert "--config" in html and "check-plugin" in html


def test_every_plugin_command_is_on_a_plugin_page():
    from budgetbench_core.plugins import get_registry

    get_registry().add_commands(cli)
    pages = "\n".join(page.read_text(encoding="utf-8") for page in (DOCS / "plugins").glob("*.md"))
    plugin_commands = [name for name, command in cli.commands.items() if not is_core(command)]
    assert plugin_commands, "no plugin command registered: the plugins are not installed"
    for name in plugin_commands:
        assert f"budgetbench {name}" in pages, f"`budgetbench {name}` is on no page under docs/plugins/"


def test_every_command_has_a_guide():
    """Beyond the generated reference, each command is shown in use on some page."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md") if p.parent.name != "cli")
    for path in command_paths(cli):
        if isinstance(cli.commands.get(path[0]), click.Group) and len(path) == 1:
            continue
        usage = "budgetbench " + " ".join(path)
        assert usage in text, f"no page shows `{usage}`"
