"""Wall time of ``budgetbench demo`` from an empty directory, and what it showed.

Runs the installed command exactly as a new user would (``.venv/bin/budgetbench demo``, a
fresh output directory, default options, plain display), so process start, plugin loading,
the embedded server's two starts, the embedding model of rag, the prompts-only run and the
answered run are all in the figure. Target: under 180 s on an idle 2-core machine; the load
average before and after is recorded, since a busy machine inflates every figure.

    .venv/bin/python benchmarks/bench_demo.py [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

from _common import ROOT, machine, median, write_result

BUDGETBENCH = ROOT / ".venv" / "bin" / "budgetbench"


def _cells(report: Path, fields: tuple[str, ...]) -> list[dict]:
    summary = json.loads(report.read_text())["summary"]
    return [{k: row.get(k) for k in ("strategy", "budget", *fields)} for row in summary]


def one_demo() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo"
        started = time.perf_counter()
        done = subprocess.run(
            [str(BUDGETBENCH), "demo", "-o", str(out), "--display", "plain"],
            cwd=tmp,
            capture_output=True,
            text=True,
            env={**os.environ, "NO_COLOR": "1"},
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"demo exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        prompts = json.loads((out / "prompts" / "manifest.json").read_text())
        answered = json.loads((out / "answered" / "manifest.json").read_text())

        def span(manifest: dict) -> float | None:
            first = manifest["invocations"][-1]
            if not first.get("finished"):
                return None
            return round(
                (datetime.fromisoformat(first["finished"]) - datetime.fromisoformat(first["started"])).total_seconds(),
                1,
            )

        return {
            "wall_s": round(wall, 1),
            "prompts_run_s": span(prompts),
            "answered_run_s": span(answered),
            "prompts_only_calls": prompts["calls_made"],
            "answered_calls": answered["calls_made"],
            "evidence": _cells(
                out / "prompts" / "report" / "report.json",
                ("violation_rate", "evidence_all", "evidence_all_low", "evidence_all_high", "evidence_all_n"),
            ),
            "quality": _cells(
                out / "answered" / "report" / "report.json",
                ("violation_rate", "quality_all", "quality_all_low", "quality_all_high", "quality_all_n"),
            ),
            "summary": [
                line
                for line in done.stderr.splitlines() + done.stdout.splitlines()
                if line.startswith(("Evidence recall", "  ", "Answered run", "reports:"))
            ][-16:],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    before = machine()
    runs = [one_demo() for _ in range(args.repeats)]
    walls = [r["wall_s"] for r in runs]
    print(
        f"demo wall time: {', '.join(f'{w:.1f} s' for w in walls)} (median {median(walls):.1f} s; target < 180 s "
        f"idle); load average before {before['load_average']}; last: prompts-only run {runs[-1]['prompts_run_s']} s, "
        f"answered run {runs[-1]['answered_run_s']} s"
    )
    for line in runs[-1]["summary"]:
        print(line)
    write_result(
        "demo", {"machine": before, "wall_s": walls, "wall_s_median": median(walls), "target_s": 180, "last": runs[-1]}
    )


if __name__ == "__main__":
    main()
