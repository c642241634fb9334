"""rag and lean_retrieval on LongMemEval_S histories (~115K tokens each).

Per item: the time to embed the history (one batched encode), the time to rank it against
the query, the time of a single-tier apply (index + ranking + one fill at 4096) and of a
whole 5-tier sweep on the same instance, whether the gold evidence (a ``has_answer`` turn;
every answer session) is in the 4096-token prompt, and that no tier's prompt is over budget.
Prompts are counted exactly by the embedded llama.cpp server's tokenizer (SmolLM2 template).

Both strategies use one persistent qdrant folder, so lean_retrieval finds rag's index for
the same history and does not embed again (its figures are ranking and fill only).

    python benchmarks/bench_rag.py [--limit N] [--chunk-tokens 0] [--name rag]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, machine, median, write_result  # noqa: E402

from budgetbench_core import PromptCounter, StrategyContext  # noqa: E402
from budgetbench_core.builtin.local_backend import LocalBackend  # noqa: E402
from budgetbench_core.builtin.tokenizers import ServerTokenizer  # noqa: E402
from budgetbench_core.plugins import get_registry  # noqa: E402

TIERS = (4096, 2048, 8192, 16384, 32768)  # the single-tier run is the first of the sweep
RECALL_TIER = 4096


def context_for(item, budget, counter, run_dir):
    def no_aux(messages, max_tokens, purpose):
        raise RuntimeError("retrieval strategies make no auxiliary calls")

    return StrategyContext(item=item, budget=budget, counter=counter, complete=no_aux, seed=0, scratch_dir=run_dir)


def evidence(item, prompt) -> dict[str, bool]:
    """Whether a has_answer turn, and every answer session, is represented in the prompt."""
    gold_turns = {(m.metadata["session_id"], m.metadata["turn"]) for m in item.history if m.metadata.get("has_answer")}
    kept = {(m.metadata.get("session_id"), m.metadata.get("turn")) for m in prompt}
    sessions = {str(s) for s in item.metadata["answer_session_ids"]}
    official = {m.metadata["session_id"]: m.metadata["official_session_id"] for m in item.history}
    kept_sessions = {official.get(m.metadata.get("session_id")) for m in prompt}  # session_id is opaque (s<n>)
    return {
        "has_gold_turns": bool(gold_turns),
        "any_gold_turn": bool(gold_turns & kept),
        "all_gold_turns": bool(gold_turns) and gold_turns <= kept,
        "all_answer_sessions": bool(sessions) and sessions <= kept_sessions,
    }


def sweep(strategy, item, counter, run_dir) -> dict:
    strategy.reset()
    out = {"tiers": {}}
    for budget in TIERS:
        context = context_for(item, budget, counter, run_dir)
        started = time.perf_counter()
        prompt = strategy.apply(item.history, budget, context)
        seconds = time.perf_counter() - started
        tokens = counter.count(prompt)
        audit = context.audit["retrieval"]
        if budget == TIERS[0]:
            out.update(
                single_tier_s=seconds,
                index=audit["index"],
                embed_s=audit["embed_s"],
                retrieve_s=audit["retrieve_s"],
                units=audit["units"],
            )
        if budget == RECALL_TIER:
            out["evidence"] = evidence(item, prompt)
        out["tiers"][budget] = {
            "apply_s": round(seconds, 4),
            "prompt_tokens": tokens,
            "over": tokens > budget,
            "units_chosen": len(audit["chosen"]),
        }
    out["sweep_s"] = sum(t["apply_s"] for t in out["tiers"].values())
    out["sweep_over_single"] = out["sweep_s"] / out["single_tier_s"]
    return out


def summarise(rows: list[dict], name: str) -> dict:
    gold = [r[name]["evidence"] for r in rows if r[name]["evidence"]["has_gold_turns"]]
    built = [r[name] for r in rows if r[name]["index"] == "built"]
    return {
        "items": len(rows),
        "items_with_gold_turns": len(gold),
        "recall_any_gold_turn_at_4096": sum(g["any_gold_turn"] for g in gold) / len(gold) if gold else None,
        "recall_all_gold_turns_at_4096": sum(g["all_gold_turns"] for g in gold) / len(gold) if gold else None,
        "recall_all_answer_sessions_at_4096": sum(g["all_answer_sessions"] for g in gold) / len(gold) if gold else None,
        "over_budget_prompts": sum(t["over"] for r in rows for t in r[name]["tiers"].values()),
        "embed_s_median": median(r["embed_s"] for r in built) if built else None,
        "embed_s_max": max(r["embed_s"] for r in built) if built else None,
        "retrieve_s_median": median(r[name]["retrieve_s"] for r in rows),
        "single_tier_s_median": median(r[name]["single_tier_s"] for r in rows),
        "sweep_s_median": median(r[name]["sweep_s"] for r in rows),
        "sweep_over_single_median": median(r[name]["sweep_over_single"] for r in rows),
        "sweep_over_single_max": max(r[name]["sweep_over_single"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="N questions balanced across types (default all 56)")
    parser.add_argument("--chunk-tokens", type=int, default=0, help="0 = whole messages (the default unit)")
    parser.add_argument("--name", default="rag", help="result file name under benchmarks/results/")
    args = parser.parse_args()
    path = DATA / "longmemeval" / "longmemeval_s_sample.json"
    if not path.exists():
        sys.exit(f"missing {path} (see ../shared/data/README.md)")
    registry = get_registry()
    task = registry.get("task", "longmemeval").obj(split="s", path=str(path))
    items = list(task.load(args.limit, 0))  # with --limit: a round-robin selection across question types
    backend = LocalBackend()
    backend.start()
    counter = PromptCounter(ServerTokenizer(backend.server_url))
    started = machine()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = f"path={tmp}/qdrant"
        params = {"chunk_tokens": args.chunk_tokens, "vector_store": store}
        rag = registry.get("strategy", "rag").obj(**params)
        lean = registry.get("strategy", "lean_retrieval").obj(**params)
        for number, item in enumerate(items, 1):
            row = {
                "item_id": item.id,
                "category": item.category,
                "messages": len(item.history),
                "history_tokens": sum(counter.message_tokens(m) for m in item.history),
                "rag": sweep(rag, item, counter, Path(tmp)),
            }
            row["embed_s"] = row["rag"]["embed_s"]
            row["lean_retrieval"] = sweep(lean, item, counter, Path(tmp))
            rows.append(row)
            print(
                f"[{number}/{len(items)}] {item.id} {row['history_tokens']} tokens, {row['rag']['units']} units: "
                f"embed {row['embed_s']:.1f}s, rank {row['rag']['retrieve_s']:.2f}s, sweep/single "
                f"{row['rag']['sweep_over_single']:.2f}; gold at 4096 rag={row['rag']['evidence']['any_gold_turn']} "
                f"lean={row['lean_retrieval']['evidence']['any_gold_turn']}",
                flush=True,
            )
            # Written after every item, so an interrupted run still leaves its figures.
            write_result(
                args.name,
                {
                    "complete": number == len(items),
                    "config": {
                        "tiers": TIERS,
                        "recall_tier": RECALL_TIER,
                        "chunk_tokens": args.chunk_tokens,
                        "embedding_model": rag.describe()["embedding_model"],
                        "tokenizer": counter.info.to_dict(),
                        "data": str(path.name),
                        "items": len(items),
                    },
                    "summary": {
                        "rag": summarise(rows, "rag"),
                        "lean_retrieval": summarise(rows, "lean_retrieval"),
                        "history_tokens_median": median(r["history_tokens"] for r in rows),
                    },
                    "rows": rows,
                    "machine_start": started,
                },
            )


if __name__ == "__main__":
    main()
