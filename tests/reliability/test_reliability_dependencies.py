"""Dependency pins: litellm can never resolve to the compromised 1.107.0 release, torch is
2.13.0, and the lock files (made by scripts/lock.sh) pin exactly what is installed."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
COMPROMISED_LITELLM = "1.107.0"


def workspace_pyprojects() -> list[Path]:
    folders = [line.strip() for line in (ROOT / "workspace.txt").read_text().splitlines() if line.strip()]
    return [ROOT / "pyproject.toml", *(ROOT / folder / "pyproject.toml" for folder in folders)]


def requirements(pyproject: Path, extras: tuple[str, ...] | None = None) -> list[Requirement]:
    """Dependencies plus the named extras (all extras when ``extras`` is None)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    listed = list(project.get("dependencies", []))
    for name, extra in project.get("optional-dependencies", {}).items():
        if extras is None or name in extras:
            listed += extra
    return [Requirement(text) for text in listed]


def pins(path: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line (hash continuation lines skipped)."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", line)
        if match:
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def test_litellm_requirement_excludes_the_compromised_release():
    core = {r.name: r for r in requirements(ROOT / "pyproject.toml")}
    assert "litellm" in core
    assert not core["litellm"].specifier.contains(COMPROMISED_LITELLM, prereleases=True)
    assert core["litellm"].specifier.contains(metadata.version("litellm"))
    for pyproject in workspace_pyprojects():  # no distribution may ask for it either
        for requirement in requirements(pyproject):
            if canonicalize_name(requirement.name) == "litellm":
                assert not requirement.specifier.contains(COMPROMISED_LITELLM, prereleases=True), pyproject
    assert metadata.version("litellm") != COMPROMISED_LITELLM


def test_torch_is_pinned_to_the_cpu_build_everywhere():
    for pyproject in workspace_pyprojects():
        for requirement in requirements(pyproject):
            if canonicalize_name(requirement.name) == "torch":
                assert str(requirement.specifier) == "==2.13.0", pyproject
    assert Version(metadata.version("torch")).public == "2.13.0"


def test_lock_files_pin_exactly_what_is_installed():
    constraints, locked = pins(ROOT / "constraints.txt"), pins(ROOT / "requirements.lock")
    assert constraints["litellm"] != COMPROMISED_LITELLM and constraints["torch"] == "2.13.0"
    assert Version(locked["torch"]).public == "2.13.0"
    assert constraints.keys() == locked.keys()
    hashed = (ROOT / "requirements.lock").read_text().count("--hash=sha256:")
    assert hashed == len(locked)
    mismatched = {}
    for name, version in constraints.items():
        installed = metadata.version(name)
        if Version(installed).public != Version(version).public:
            mismatched[name] = (version, installed)
    assert mismatched == {}, "the venv drifted from the lock: rerun scripts/lock.sh (or install.sh)"
    # Every third-party requirement install.sh installs (the core's test extra included) is locked.
    for pyproject in workspace_pyprojects():
        for requirement in requirements(pyproject, extras=("test",) if pyproject.parent == ROOT else ()):
            name = canonicalize_name(requirement.name)
            if not name.startswith("budgetbench") and requirement.marker is None:
                assert name in constraints, f"{name} ({pyproject}) is not in constraints.txt"
