"""Every distribution of the repository, and a plugin made by ``new-plugin``, can be published:
``python -m build`` makes its sdist and a wheel built from that sdist, and ``twine check
--strict`` accepts both (the metadata PyPI would be sent: name, version, licence, readme).

Built with ``--no-isolation`` so the test needs no network: the venv's setuptools (pinned
in constraints.txt) is the backend, as install.sh installs it.
"""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from budgetbench_core.cli import cli

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [".", *(line.strip() for line in (ROOT / "workspace.txt").read_text().splitlines() if line.strip())]


def build(source: Path, out: Path) -> tuple[Path, Path]:
    """``python -m build`` of ``source`` into ``out``: (sdist, wheel)."""
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sdists, wheels = list(out.glob("*.tar.gz")), list(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return sdists[0], wheels[0]


def twine_check(*files: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(archive.read(name))


def wheel_entry_points(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")), None)
        return archive.read(name).decode() if name else ""


@pytest.mark.slow
@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: "budgetbench" if f == "." else Path(f).name)
def test_distribution_builds_and_passes_twine_check(folder, tmp_path):
    source = (ROOT / folder).resolve()
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    sdist, wheel = build(source, tmp_path)
    assert twine_check(sdist, wheel).count("PASSED") == 2
    metadata = wheel_metadata(wheel)
    assert metadata["Name"] == project["name"] and metadata["Version"] == project["version"]
    assert metadata.get("License-Expression") or metadata.get("License"), "a licence PyPI can show"
    assert "budgetbench" in wheel_entry_points(wheel), "the entry point that registers it"
    with tarfile.open(sdist) as archive:
        assert any(n.endswith("/pyproject.toml") for n in archive.getnames())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["strategy", "memory-system"])
def test_new_plugin_builds_and_passes_twine_check(kind, tmp_path):
    """What an author publishes: a licence, the core as a PyPI requirement, the entry point."""
    result = CliRunner().invoke(cli, ["new-plugin", kind, "my-plugin", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    target = Path(result.output.split("created ", 1)[1].splitlines()[0])
    sdist, wheel = build(target, tmp_path / "dist")
    twine_check(sdist, wheel)
    metadata = wheel_metadata(wheel)
    assert metadata["License-Expression"] == "MIT"
    # A direct (git or file) reference would make PyPI refuse the upload: the core stays a
    # version range, which pip satisfies from a local core wheel (--find-links) until the core
    # is on PyPI.
    assert metadata.get_all("Requires-Dist")[0] == "budgetbench<0.2,>=0.1"
    assert "@" not in " ".join(metadata.get_all("Requires-Dist"))
    prefix = "strategy" if kind == "strategy" else "memory"
    assert f"{prefix}-my-plugin = budgetbench_{prefix}_my_plugin" in wheel_entry_points(wheel)


def test_new_plugin_strategy_shows_the_parameter_pattern(tmp_path):
    """The rendered strategy takes a parameter and hands it to ``super().__init__``, so
    ``describe()`` (the manifest) records it and ``describe``/the parameter check see it."""
    import importlib.util

    from budgetbench_core.params import parameters_of

    result = CliRunner().invoke(cli, ["new-plugin", "strategy", "with-param", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    target = Path(result.output.split("created ", 1)[1].splitlines()[0])
    source = target / "budgetbench_strategy_with_param" / "__init__.py"
    assert "super().__init__(max_messages=max_messages, **params)" in source.read_text()
    spec = importlib.util.spec_from_file_location("rendered_with_param", source)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    strategy = module.WithParam(max_messages=3)
    assert strategy.describe()["params"] == {"max_messages": 3} and strategy.max_messages == 3
    accepted = parameters_of(module.WithParam)
    assert list(accepted) == ["max_messages"] and "newest messages" in accepted["max_messages"].help
    with pytest.raises(ValueError, match="max_messages must be >= 0"):
        module.WithParam(max_messages=-1)
    readme = (target / "README.md").read_text()
    assert "--find-links" in readme and "git+https://" in readme and "super().__init__(**params)" in readme
