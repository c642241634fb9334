"""tau-bench agent prompt sizes in both tool modes, counted by the embedded model's exact counter.

JSON-action mode describes the tools in the system prompt; native mode (``tools=native``) sends
upstream's agent instruction and policy as the system prompt and the tool schemas beside it,
which the served template renders into the prompt (the tool block). For retail, airline and
telecom: the system message (rendered alone, with the generation prompt), the tool block, and
the first agent prompt of the first test task (system, greeting, the scripted user's opening).
The table goes into docs/plugins/taubench.md.

    .venv/bin/python benchmarks/taubench_prompt_sizes.py
"""

from __future__ import annotations

import json

from _common import DATA
from budgetbench_task_taubench.task import TauBench

from budgetbench_core import Message
from budgetbench_core.testing import embedded_backend, exact_counter

DOMAINS = ("retail", "airline", "telecom")


def sizes(counter, domain: str, mode: str) -> dict[str, int]:
    task = TauBench(domain=domain, path=str(DATA / "taubench" / domain), user="scripted", tools=mode)
    item = next(iter(task.load(None, 0)))
    schemas = task.tool_schemas()
    agent = counter.with_tools(json.dumps(schemas, ensure_ascii=False)) if schemas else counter
    system = [item.system or Message("system", "")]
    return {
        "system": counter.count(system),
        "tool_block": agent.count(system) - counter.count(system),
        "first_prompt": agent.count([*system, *item.history, item.query]),
    }


def main() -> None:
    with embedded_backend() as backend:
        counter = exact_counter(backend)
        print(
            "| domain | JSON mode: system prompt | native: system prompt | native: tool block | native: total "
            "| first prompt, JSON | first prompt, native |"
        )
        print("|---|---|---|---|---|---|---|")
        for domain in DOMAINS:
            plain, native = sizes(counter, domain, "json"), sizes(counter, domain, "native")
            print(
                f"| {domain} | {plain['system']:,} | {native['system']:,} | {native['tool_block']:,} | "
                f"{native['system'] + native['tool_block']:,} | {plain['first_prompt']:,} | {native['first_prompt']:,} |"
            )


if __name__ == "__main__":
    main()
