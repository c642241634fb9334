"""The judge audit card: how often a run's LLM judge agrees with answers whose verdict is known.

A judged score is only as good as its judge: a lenient judge prompt can accept most vague,
wrong answers, and the same answers can score very differently under two prompts. So every
judged run carries a card measured on the task's own questions, graded through the task's own
grader with the run's judge (the same caller, temperature and seed as the runner's
``GradingContext``), so it audits exactly the judge that produced the scores:

- ``gold``: the question's gold answer (must be accepted);
- ``other_gold``: another question's gold answer, of the same category where one exists
  (must be rejected);
- ``vague``: an answer that names no specific fact, shaped like the question ("Sometime last
  year.", "Various activities.") (must be rejected);
- ``idk_abstention``: "I don't know." on an abstention question (must be accepted);
- ``idk_answerable``: "I don't know." on an answerable question (must be rejected).

An abstention question is an item whose ``metadata["abstention"]`` is true. A probe counts
as accepted when its quality is at least 0.5. A judge fails the card when it accepts more
than 10% of the probes of any must-reject kind (vague answers above all) or fewer than 90%
of any must-accept kind (docs/judge-audit.md says why these figures).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ..graders import Grader, GradingContext
from ..messages import Item, Message

CARD_FILE = "judge_audit.json"
CARD_SCHEMA = 1
DEFAULT_ITEMS = 100  # answerable questions probed (each gives four probes), plus as many abstention ones
MAX_WRONG_ACCEPTED = 0.10  # a must-reject kind accepted more often than this fails the card
MIN_RIGHT_ACCEPTED = 0.90  # a must-accept kind accepted less often than this fails the card
JUDGE_CONTEXT = 8192  # judge prompts are short; fits the embedded model's context too
IDK = "I don't know."


@dataclass(frozen=True)
class Kind:
    name: str
    what: str  # completes "the judge accepts ..."
    accept: bool  # the known verdict


KINDS = (
    Kind("gold", "the gold answer", True),
    Kind("other_gold", "another question's gold answer", False),
    Kind("vague", "vague answers naming no specific fact", False),
    Kind("idk_abstention", '"I don\'t know" on abstention questions', True),
    Kind("idk_answerable", '"I don\'t know" on answerable questions', False),
)
KIND = {k.name: k for k in KINDS}

# Vague answers by the question's form: each names no date, number, place, person or thing.
VAGUE = {
    "count": ("A few.", "Several.", "Quite a lot."),
    "duration": ("For a while.", "Quite some time."),
    "frequency": ("From time to time.", "Every so often."),
    "time": ("Sometime last year.", "A while ago.", "At some point in the past."),
    "place": ("Somewhere mentioned before.", "At a place from an earlier conversation."),
    "person": ("Someone they know.", "A person mentioned before."),
    "reason": ("For personal reasons.", "Because of something that came up."),
    "other": ("Various activities.", "Something mentioned in an earlier conversation.", "It depends."),
}
_FORMS = (
    ("count", r"\bhow (many|much)\b"),
    ("duration", r"\bhow long\b"),
    ("frequency", r"\bhow often\b"),
    ("time", r"\b(when|what (date|time|year|month|day)|which (year|month|day))\b"),
    ("place", r"\bwhere\b"),
    ("person", r"\bwho(m|se)?\b"),
    ("reason", r"\bwhy\b"),
)


class JudgeAuditError(ValueError):
    """The card cannot be made; the message says what is missing."""


@dataclass(frozen=True)
class Probe:
    kind: str
    item: Item
    response: str


def _normal(text: object) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", str(text).lower()).split())


def _overlaps(a: str, b: str) -> bool:
    """One normalised answer contains the other as whole words (then it is not a wrong answer)."""
    return f" {a} " in f" {b} " or f" {b} " in f" {a} "


def question_text(item: Item) -> str:
    return str(item.metadata.get("question") or item.query.content)


def vague_answer(question: str, gold: str, rng: random.Random) -> str:
    """A vague answer of the question's form that does not contain the gold answer."""
    form = next((name for name, pattern in _FORMS if re.search(pattern, question.lower())), "other")
    fits = [a for a in VAGUE[form] if not _overlaps(_normal(a), _normal(gold))]
    return rng.choice(fits or [a for a in VAGUE["other"] if not _overlaps(_normal(a), _normal(gold))])


def build_probes(items: Iterable[Item], n: int = DEFAULT_ITEMS, seed: int = 0) -> list[Probe]:
    """Probes from up to ``n`` answerable and ``n`` abstention items, chosen with ``seed``.
    Items are kept without their history (a judge grades the answer, not the conversation)."""
    answerable: list[Item] = []
    abstaining: list[Item] = []
    for item in items:
        light = replace(item, history=())
        if item.metadata.get("abstention"):
            abstaining.append(light)
        elif _normal(item.answer):
            answerable.append(light)
    rng = random.Random(seed)
    by_category: dict[str | None, list[Item]] = {}
    for item in answerable:
        by_category.setdefault(item.category, []).append(item)
    probes: list[Probe] = []
    for item in rng.sample(answerable, min(n, len(answerable))):
        gold = str(item.answer)
        probes.append(Probe("gold", item, gold))
        other = _other_answer(item, by_category.get(item.category, []), answerable, rng)
        if other is not None:
            probes.append(Probe("other_gold", item, other))
        probes.append(Probe("vague", item, vague_answer(question_text(item), gold, rng)))
        probes.append(Probe("idk_answerable", item, IDK))
    probes += [Probe("idk_abstention", item, IDK) for item in rng.sample(abstaining, min(n, len(abstaining)))]
    return probes


def _other_answer(item: Item, same: list[Item], every: list[Item], rng: random.Random) -> str | None:
    """Another question's gold answer that does not contain this one's (nor is contained in it)."""
    gold = _normal(item.answer)
    for pool in (same, every):
        for _ in range(20):
            other = rng.choice(pool) if pool else None
            if other is not None and other.id != item.id and not _overlaps(_normal(other.answer), gold):
                return str(other.answer)
    return None


class CountingJudge:
    """The runner's judge call (its caller, temperature 0, the run's seed: the same replies and
    cache entries) that also counts the judge's own calls and tokens, apart from the agent's.
    Token counts are the judge server's own (``usage``), i.e. the judge's tokenizer."""

    def __init__(self, caller: Any, seed: int | None) -> None:
        self.caller = caller
        self.seed = seed
        self._lock = threading.Lock()
        self.calls = self.cached = self.prompt_tokens = self.completion_tokens = self.unreported = 0
        self.cost: float | None = None
        self._prompts: set[str] = set()

    def __call__(self, messages: Sequence[Message], max_tokens: int) -> str:
        from ..backends import GenerationParams
        from ..sandbox import canonical_prompt

        prompt = canonical_prompt(list(messages))
        outcome = self.caller.call(prompt, GenerationParams(int(max_tokens), 0.0, self.seed))
        completion = outcome.completion
        digest = hashlib.sha256(json.dumps([[m.role, m.content] for m in prompt]).encode()).hexdigest()
        with self._lock:
            self.calls += 1
            self.cached += bool(outcome.cached)
            self._prompts.add(digest)
            if completion.prompt_tokens is None:
                self.unreported += 1
            else:
                self.prompt_tokens += completion.prompt_tokens
            self.completion_tokens += completion.completion_tokens or 0
            if completion.cost is not None:
                self.cost = (self.cost or 0.0) + completion.cost
        return completion.text

    def prompts_hash(self) -> str:
        """sha256 over every distinct judge prompt sent: equal cards saw equal prompts."""
        return hashlib.sha256("\n".join(sorted(self._prompts)).encode()).hexdigest()

    def totals(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "cached": self.cached,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "unreported_calls": self.unreported,
            "cost_usd": self.cost,
            "counted_by": "the judge server's usage (the judge's own tokenizer)",
        }


def _grade(grader: Grader, probe: Probe, context: GradingContext) -> dict[str, Any]:
    row: dict[str, Any] = {
        "kind": probe.kind,
        "item_id": probe.item.id,
        "category": probe.item.category,
        "response": probe.response,
        "expected": KIND[probe.kind].accept,
    }
    try:
        verdict = grader.grade(probe.item, probe.response, context)
    except Exception as exc:  # a failed judge call or a grader bug: counted apart, never as a verdict
        return {**row, "error": f"{type(exc).__name__}: {exc}"}
    quality = float(verdict.quality)
    return {**row, "quality": quality, "accepted": quality >= 0.5, "detail": verdict.detail}


def audit_judge(
    items: Iterable[Item],
    grader: Grader,
    judge: CountingJudge,
    judge_model: str,
    n: int = DEFAULT_ITEMS,
    seed: int = 0,
    concurrency: int = 4,
) -> dict[str, Any] | None:
    """The card for ``grader`` asking ``judge``, or None when the grader asks no judge."""
    probes = build_probes(items, n, seed)
    if not probes:
        raise JudgeAuditError("the task has no item with a text answer or an abstention flag to probe")
    context = GradingContext(judge=judge, judge_model=judge_model)
    first = _grade(grader, probes[0], context)
    if "error" in first:
        raise JudgeAuditError(f"grader {grader.name!r} failed on the first probe: {first['error']}")
    if judge.calls == 0:
        return None
    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        graded = [first, *pool.map(lambda p: _grade(grader, p, context), probes[1:])]
    return make_card(graded, grader, judge, judge_model, n, seed, time.perf_counter() - started)


def make_card(
    graded: list[dict[str, Any]],
    grader: Grader,
    judge: CountingJudge,
    judge_model: str,
    n: int,
    seed: int,
    seconds: float,
) -> dict[str, Any]:
    from .stats import wilson

    kinds = []
    for kind in KINDS:
        rows = [r for r in graded if r["kind"] == kind.name]
        scored = [r for r in rows if "error" not in r]
        accepted = sum(r["accepted"] for r in scored)
        low, high = wilson(accepted, len(scored)) if scored else (None, None)
        rate = accepted / len(scored) if scored else None
        passes = None if rate is None else (rate >= MIN_RIGHT_ACCEPTED if kind.accept else rate <= MAX_WRONG_ACCEPTED)
        kinds.append(
            {
                "kind": kind.name,
                "what": kind.what,
                "must_accept": kind.accept,
                "n": len(scored),
                "accepted": accepted,
                "rate": rate,
                "low": low,
                "high": high,
                "errors": len(rows) - len(scored),
                "passes": passes,
            }
        )
    hashes = sorted({str(r["detail"]["prompt_hash"]) for r in graded if "prompt_hash" in (r.get("detail") or {})})
    return {
        "schema": CARD_SCHEMA,
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "grader": {"name": grader.name, "version": str(grader.version)},
        "judge_model": judge_model,
        "prompt_hash": ",".join(hashes) if hashes else judge.prompts_hash(),
        "prompt_hash_source": "grader" if hashes else "sent prompts",
        "items": n,
        "seed": seed,
        "thresholds": {"max_wrong_accepted": MAX_WRONG_ACCEPTED, "min_right_accepted": MIN_RIGHT_ACCEPTED},
        "kinds": kinds,
        "passed": all(k["passes"] is not False for k in kinds),
        "failures": [k["kind"] for k in kinds if k["passes"] is False],
        "cost": {**judge.totals(), "seconds": round(seconds, 3)},
        "probes": graded,
    }


# --- the card in words (the CLI and every judged report) ---------------------------------


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def kind_line(kind: dict[str, Any]) -> str:
    """``The judge accepts vague answers naming no specific fact 4% [2%, 8%] of 100 ...``"""
    if not kind["n"]:
        return f"The judge accepts {kind['what']}: no probe (the task has none of this kind)."
    rule = f"at least {_pct(MIN_RIGHT_ACCEPTED)}" if kind["must_accept"] else f"at most {_pct(MAX_WRONG_ACCEPTED)}"
    errors = f"; {kind['errors']} probes failed to grade" if kind["errors"] else ""
    verdict = "" if kind["passes"] else " FAILS"
    return (
        f"The judge accepts {kind['what']} {_pct(kind['rate'])} [{_pct(kind['low'])}, {_pct(kind['high'])}] "
        f"of {kind['n']} (must be {rule}{errors}){verdict}."
    )


def banner(card: dict[str, Any]) -> str | None:
    """The line a failing card puts at the top of the report; None when the card passes."""
    if card["passed"]:
        return None
    failed = "; ".join(
        f"it accepts {k['what']} {_pct(k['rate'])} (must be "
        + (f"at least {_pct(MIN_RIGHT_ACCEPTED)})" if k["must_accept"] else f"at most {_pct(MAX_WRONG_ACCEPTED)})")
        for k in card["kinds"]
        if k["passes"] is False
    )
    return f"THE JUDGE FAILS ITS AUDIT CARD ({card['judge_model']}): {failed}. Judged scores here are not trustworthy."


def card_lines(card: dict[str, Any]) -> list[str]:
    """The card as plain sentences, worst news first."""
    cost = card["cost"]
    tokens = f"{cost['prompt_tokens']:,} prompt and {cost['completion_tokens']:,} completion tokens"
    unreported = f" ({cost['unreported_calls']} calls reported no usage)" if cost["unreported_calls"] else ""
    dollars = f", ${cost['cost_usd']:.4f}" if cost.get("cost_usd") is not None else ""
    probes = sum(k["n"] + k["errors"] for k in card["kinds"])
    return [
        *([line] if (line := banner(card)) else []),
        f"Judge audit card: {card['judge_model']} judging with {card['grader']['name']} v{card['grader']['version']} "
        f"(prompt hash {card['prompt_hash'][:16]}, from the {card['prompt_hash_source']}), {probes} known-answer "
        f"probes from the task's own questions (seed {card['seed']}): {'PASSED' if card['passed'] else 'FAILED'}.",
        *(kind_line(k) for k in card["kinds"]),
        f"Judge cost of the audit, counted apart from the agent's calls: {cost['calls']} calls "
        f"({cost['cached']} from the cache), {tokens} as the judge's server counted them{unreported}{dollars}.",
    ]


# --- the card in a run directory and in its report ----------------------------------------


def write_card(path: Path, card: dict[str, Any]) -> Path:
    """Write ``card`` to ``path`` (``RUN_DIR/judge_audit.json`` for a run's report)."""
    from ..runlog import write_json_atomic

    write_json_atomic(Path(path), card)
    return Path(path)


def judge_models_used(rows: Iterable[dict[str, Any]]) -> set[str]:
    """Judges named by the rows: a judge grader records ``judge_model`` in its verdict, an
    episode's judged figures (tau-bench's NL assertions) in its outcome."""
    used = set()
    for row in rows:
        outcome = (row.get("episode") or {}).get("outcome")
        for source in (row.get("verdict"), (outcome or {}).get("nl_assertions") if isinstance(outcome, dict) else None):
            if isinstance(source, dict) and source.get("judge_model"):
                used.add(str(source["judge_model"]))
    return used


@dataclass
class JudgeAuditSection:
    """What a report shows about its judge: sentences for the findings, a banner for the top."""

    lines: list[str]
    banner: str | None
    card: dict[str, Any] | None

    def add_to(self, context: dict[str, Any]) -> None:
        """Put the card first among the report's findings and a failing judge in its header."""
        if not self.lines:
            return
        context["findings"] = self.lines + list(context.get("findings") or [])
        context["judge_audit"] = {k: v for k, v in (self.card or {}).items() if k != "probes"} or None
        if self.banner:
            context["header"]["grader"] = f"{context['header']['grader']} — THE JUDGE FAILS ITS AUDIT CARD (Findings)"


def judge_audit_section(run_dir: Path, rows: Iterable[dict[str, Any]]) -> JudgeAuditSection:
    """The report's judge audit section: the card when the run has one, a pointer to
    ``budgetbench judge-audit`` when a judge graded the run without one, nothing otherwise."""
    path = Path(run_dir) / CARD_FILE
    used = judge_models_used(rows)
    if not path.is_file():
        if not used:
            return JudgeAuditSection([], None, None)
        return JudgeAuditSection(
            [
                f"A judge ({', '.join(sorted(used))}) graded this run, but the run has no judge audit card "
                f"({CARD_FILE}): `budgetbench judge-audit {run_dir}` makes one."
            ],
            None,
            None,
        )
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
        lines = card_lines(card)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return JudgeAuditSection([f"The judge audit card {path} is unreadable ({exc}); make it again."], None, None)
    stale = sorted(used - {card["judge_model"]})
    if stale:
        lines.append(f"The card audits {card['judge_model']}, but this run was also judged by {', '.join(stale)}.")
    return JudgeAuditSection(lines, banner(card), card)


# --- budgetbench judge-audit --------------------------------------------------------------


def _settings(run_dir: Path | None, task, task_options, grader, judge_model, judge_api_base, seed) -> dict[str, Any]:
    """Task, grader and judge from the command line, or from RUN_DIR's manifest (options given win)."""
    from ..events import SchemaError
    from ..option_values import parse_pairs as _parse_pairs
    from ..runlog import load_manifest

    settings: dict[str, Any] = {"api_base": judge_api_base, "seed": seed, "options": {}}
    if run_dir is not None:
        try:
            manifest = load_manifest(run_dir)
        except SchemaError as exc:
            raise click.UsageError(str(exc)) from None
        if not manifest or not manifest.config:
            raise click.UsageError(f"{run_dir}: no manifest.json with a config; is it a run directory?")
        config = manifest.config
        settings["options"] = dict(config.get("task_options") or {})
        settings["task"] = config.get("task")
        settings["grader"] = (manifest.grader or {}).get("name")
        settings["judge_model"] = config.get("judge_model") or config.get("model")
        if settings["judge_model"] == config.get("model") and judge_api_base is None:
            settings["api_base"] = config.get("api_base")  # the served model judges, as in the run
        settings["seed"] = config.get("seed", 0) if seed is None else seed
    settings["options"].update(_parse_pairs(task_options, "--task-option"))
    for key, value in (("task", task), ("grader", grader), ("judge_model", judge_model)):
        if value is not None:
            settings[key] = value
    if not settings.get("task") or not settings.get("judge_model"):
        raise click.UsageError("give RUN_DIR, or --task and --judge-model")
    settings["seed"] = settings["seed"] or 0
    return settings


def _key_of(run_dir: Path) -> bytes:
    from ..integrity import IntegrityError, key_of

    try:
        return key_of(run_dir)
    except IntegrityError as exc:
        raise click.UsageError(str(exc)) from None


@click.command("judge-audit")
@click.argument("run_dir", required=False, type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("-t", "--task", default=None, help="Task whose questions make the probes (default: RUN_DIR's).")
@click.option("--task-option", "task_options", multiple=True, metavar="KEY=VALUE", help="A task option (repeat).")
@click.option("-g", "--grader", default=None, help="Grader to audit (default: RUN_DIR's, else the task's default).")
@click.option("--judge-model", default=None, help="The judge (default: RUN_DIR's judge, else its model).")
@click.option("--judge-api-base", default=None, help="Server address of the judge model.")
@click.option("-n", "--items", type=click.IntRange(1), default=DEFAULT_ITEMS, show_default=True, help="Questions.")
@click.option("--seed", type=int, default=None, help="Which questions are probed (default: RUN_DIR's seed, else 0).")
@click.option(
    "-j", "--max-concurrency", type=click.IntRange(1), default=4, show_default=True, help="Judge calls in flight."
)
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True, help="Per judge call (s).")
@click.option("-o", "--out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write the card.")
@click.option("--json", "as_json", is_flag=True, help="Print the card as JSON.")
def judge_audit_command(
    run_dir,
    task,
    task_options,
    grader,
    judge_model,
    judge_api_base,
    items,
    seed,
    max_concurrency,
    timeout_s,
    out,
    as_json,
) -> None:
    """Known-answer probes of an LLM judge on a task's own questions; prints the judge audit card.

    With RUN_DIR, audits that run's task, grader and judge and writes RUN_DIR/judge_audit.json
    (the report shows it). Exit 0 when the judge passes, 1 when it fails, 2 on a usage error.
    """
    from ..cache import CACHE_FILE, ResponseCache
    from ..model_calls import ModelCaller
    from ..plugins import get_registry

    settings = _settings(run_dir, task, task_options, grader, judge_model, judge_api_base, seed)
    registry = get_registry()
    task_obj = registry.get("task", settings["task"]).obj(**settings["options"])
    grader_name = settings.get("grader") or task_obj.default_grader
    grader_obj = registry.get("grader", grader_name).obj()
    backend_class = registry.resolve_backend(settings["judge_model"])
    backend = backend_class.obj(
        settings["judge_model"],
        api_base=settings["api_base"],
        timeout_s=timeout_s,
        max_context=JUDGE_CONTEXT,
        max_concurrency=max_concurrency,
    )
    # Its replies are kept in the run's cache, MAC'd under the run's key as the run's own are.
    cache = ResponseCache(run_dir / CACHE_FILE, _key_of(run_dir)) if run_dir is not None else None
    backend.start()
    try:
        caller = ModelCaller(backend, cache, max_concurrency, timeout_s=timeout_s)
        judge = CountingJudge(caller, settings["seed"])
        card = audit_judge(
            task_obj.load(None, settings["seed"]),
            grader_obj,
            judge,
            settings["judge_model"],
            items,
            settings["seed"],
            max_concurrency,
        )
    finally:
        backend.stop()
        if cache is not None:
            cache.close()
    if card is None:
        raise click.UsageError(f"grader {grader_name!r} asks no judge: there is nothing to audit")
    card["task"] = {"name": settings["task"], "options": settings["options"]}
    for path in ([run_dir / CARD_FILE] if run_dir is not None else []) + ([out] if out else []):
        click.echo(f"card: {write_card(path, card)}", err=True)
    click.echo(json.dumps(card, indent=1, default=str) if as_json else "\n".join(card_lines(card)))
    raise SystemExit(0 if card["passed"] else 1)
