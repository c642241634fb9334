"""Rewrites the options table of docs/cli/run.md from the ``run`` command's Setting declarations
(``budgetbench_core.cli.RUN_SETTINGS``); tests/test_run_settings.py fails while the page is stale.

    .venv/bin/python scripts/run_options_table.py
"""

from __future__ import annotations

from pathlib import Path

from budgetbench_core.cli import RUN_SETTINGS
from budgetbench_core.run_config import OPTIONS_BEGIN, OPTIONS_END, options_table

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli" / "run.md"


def main() -> None:
    text = PAGE.read_text(encoding="utf-8")
    if OPTIONS_BEGIN not in text or OPTIONS_END not in text:
        raise SystemExit(f"{PAGE}: no {OPTIONS_BEGIN} ... {OPTIONS_END} block to rewrite")
    head, rest = text.split(OPTIONS_BEGIN, 1)
    tail = rest.split(OPTIONS_END, 1)[1]
    PAGE.write_text(f"{head}{OPTIONS_BEGIN}\n\n{options_table(RUN_SETTINGS)}\n{OPTIONS_END}{tail}", encoding="utf-8")
    print(f"wrote the options table of {PAGE}")


if __name__ == "__main__":
    main()
