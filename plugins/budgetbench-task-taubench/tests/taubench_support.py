"""Shared helpers for the tau-bench tests: the shared data folder and cached domains."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from budgetbench_task_taubench.domain import Domain, load_domain

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT.parent / "shared" / "data" / "taubench"
needs_data = pytest.mark.skipif(not (DATA / "retail" / "db.json").is_file(), reason=f"shared data not found at {DATA}")


@cache
def domain(name: str) -> Domain:
    return load_domain(name, DATA / name)
