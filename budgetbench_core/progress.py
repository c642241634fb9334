"""What the terminal shows during and after a run: ``--display rich|plain|none``.

- ``rich``: an overall bar and one bar per strategy, each with an ETA computed from the
  cells finished in this invocation (cells resumed from disk do not count as speed).
- ``plain``: one line per finished cell, flushed at once: for CI logs and pipes. It is
  what ``auto`` (the default) picks when stderr is not a terminal.
- ``none``: no progress; only the one-line summary and what stopped a run.

A total is exact only once the runner says the task has no more items (``final``), or at the
end once every announced cell is counted; before that it is shown as "at least" (``[12/>=48]``, ``12/≥48`` on the bars), and a count never runs past its total. An
agent episode shows each turn as it ends (``turn``): a line in ``plain``, a row of its own
in ``rich``, so a long episode is never silent. The last line of ``plain`` is the run's
count, resumed cells included, so a finished resume ends at 100%.

After the run (``rich`` and ``plain``): a strategy x budget table of quality (all) with its 95%
interval and the counts of violations, strategy failures (both scored 0) and harness errors, all
from the report's own ``summarise`` (the same numbers as the report's summary); the error
causes grouped with counts, and the served-count audit (server's ``usage.prompt_tokens``
against our count).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

DISPLAYS = ("auto", "rich", "plain", "none")
OVERALL = "all"


def choose_display(requested: str, stream: Any = None) -> str:
    """``auto`` is ``rich`` on a terminal, ``plain`` otherwise (CI logs, pipes, files)."""
    if requested != "auto":
        return requested
    stream = stream or sys.stderr
    return "rich" if getattr(stream, "isatty", lambda: False)() else "plain"


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "eta --"
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"eta {hours}:{minutes:02d}:{secs:02d}" if hours else f"eta {minutes}:{secs:02d}"


@dataclass
class _Counter:
    """Cells of one bar: total, already done on disk, finished in this invocation."""

    total: int
    skipped: int = 0
    finished: int = 0

    @property
    def done(self) -> int:
        return self.skipped + self.finished

    @property
    def shown_total(self) -> int:
        """The announced total, or the count when cells arrived before their announcement."""
        return max(self.total, self.done)

    def eta(self, started: float, now: float) -> float | None:
        """Time so far per cell finished in this invocation, times the cells left: it grows while
        nothing finishes, rather than counting down to 0 on a stalled run."""
        if not self.finished:
            return None
        remaining = self.total - self.done
        return (now - started) / self.finished * remaining if remaining > 0 else 0.0


class _CountColumn(ProgressColumn):
    """``done/total``, ``done/≥total`` while the task may still add items."""

    def __init__(self, display: Display) -> None:
        super().__init__()
        self.display = display

    def render(self, task) -> Text:
        counter = self.display.counters.get(task.fields.get("key"))
        if counter is None:
            return Text(task.fields.get("turns", ""), style="progress.download")
        return Text(f"{counter.done}/{self.display.at_least}{counter.shown_total}", style="progress.download")


class _EtaColumn(ProgressColumn):
    def __init__(self, display: Display) -> None:
        super().__init__()
        self.display = display

    def render(self, task) -> Text:
        counter = self.display.counters.get(task.fields.get("key"))
        if counter is None:
            return Text("")
        return Text(format_eta(counter.eta(self.display.started, time.monotonic())), style="progress.remaining")


@dataclass
class Display:
    """Receives the runner's callbacks; ``start`` before the first cell, ``close`` after the last."""

    mode: str
    console: Console = field(default_factory=lambda: Console(stderr=True))
    stream: Any = None

    def __post_init__(self) -> None:
        self.stream = self.stream or sys.stderr
        self.counters: dict[str, _Counter] = {}
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._progress: Progress | None = None
        self._tasks: dict[str, Any] = {}
        self._episodes: dict[tuple, Any] = {}  # rich rows of the episodes in flight
        self._pending = threading.local()
        self.final = False

    @property
    def at_least(self) -> str:
        return "" if self.final else "≥"

    # ----------------------------------------------------------------- runner callbacks

    def start(self, total: int, per_strategy: dict[str, int], final: bool = False) -> None:
        """The runner's ``on_start``; called again with larger totals as a streamed task's items
        arrive. ``final``: no item is left to read, so the total is exact; until then it is "at least"."""
        self.final = final
        if getattr(self, "_begun", False):
            self._grow(total, per_strategy, told_final=final)
            return
        self._begun = True
        self.started = time.monotonic()
        with self._lock:  # cells found done on disk may be counted before the first announcement: kept
            for name, cells in {OVERALL: total, **per_strategy}.items():
                self.counters.setdefault(name, _Counter(0)).total = cells
        if self.mode == "rich":
            width = max(len(OVERALL), *(len(name) for name in per_strategy)) + 1
            self._progress = Progress(
                TextColumn(f"{{task.description:<{width}}}"),
                BarColumn(),
                _CountColumn(self),
                TimeElapsedColumn(),
                _EtaColumn(self),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            for name, cells in {OVERALL: total, **per_strategy}.items():
                done = self.counters[name].done
                self._tasks[name] = self._progress.add_task(name, total=cells, completed=done, key=name)
        elif self.mode == "plain":
            counts = ", ".join(f"{s} {n}" for s, n in per_strategy.items())
            if self.final:
                self._write(f"run: {total} cells ({counts})")
            else:
                self._write(f"run: at least {total} cells so far ({counts}); more as the task's items are read")

    def _grow(self, total: int, per_strategy: dict[str, int], told_final: bool) -> None:
        with self._lock:
            if self.mode == "plain" and told_final:
                self._write(f"run: {total} cells in all ({', '.join(f'{s} {n}' for s, n in per_strategy.items())})")
            for name, cells in {OVERALL: total, **per_strategy}.items():
                self.counters.setdefault(name, _Counter(0)).total = cells
                if self._progress is None:
                    continue
                if name in self._tasks:
                    self._progress.update(self._tasks[name], total=cells)
                else:
                    done = self.counters[name].done
                    self._tasks[name] = self._progress.add_task(name, total=cells, completed=done, key=name)

    def finished(self, row: dict[str, Any]) -> None:
        """The runner's ``on_cell``: a cell's terminal row, written on the worker thread that
        then calls ``progress`` for the same cells."""
        self._pending.cells = getattr(self._pending, "cells", 0) + 1
        with self._lock:
            episode = self._episodes.pop(_episode_key(row), None)
            if episode is not None and self._progress is not None:
                self._progress.remove_task(episode)
        self._count(str(row.get("strategy")), row, skipped=False)

    def turn(self, row: dict[str, Any]) -> None:
        """One turn of an agent episode has ended: ``strategy``, ``budget``, ``repeat``,
        ``item_id``, ``turn`` (from 1), ``max_turns``, and ``prompt_tokens``, ``latency_s``,
        ``cached`` of its call; an episode runs for minutes, and its cell row comes only at the end."""
        what = f"turn {row.get('turn')}/{row.get('max_turns', '?')} prompt={row.get('prompt_tokens')}"
        if row.get("cached"):
            what += " (cached)"
        elif row.get("latency_s") is not None:
            what += f" {float(row['latency_s']):.1f}s"
        where = f"{row.get('strategy')} b={row.get('budget')} r{row.get('repeat', 0)} {row.get('item_id')}"
        with self._lock:
            if self._progress is not None:
                key = _episode_key(row)
                if key not in self._episodes:
                    self._episodes[key] = self._progress.add_task(f"  {where}", total=None, turns="")
                self._progress.update(self._episodes[key], turns=what)
            elif self.mode == "plain":
                self._write(f"{self._head()} {where}  {what}")

    def progress(self, strategy: str, cells: int) -> None:
        """The runner's ``progress``: cells this thread reported through ``finished`` are already
        counted; the others were found done on disk (a resume)."""
        reported = min(cells, getattr(self._pending, "cells", 0))
        self._pending.cells = getattr(self._pending, "cells", 0) - reported
        for _ in range(cells - reported):
            self._count(strategy, None, skipped=True)

    def _count(self, strategy: str, row: dict[str, Any] | None, skipped: bool) -> None:
        now = time.monotonic()
        with self._lock:
            for key in (OVERALL, strategy):
                counter = self.counters.setdefault(key, _Counter(0))
                if skipped:
                    counter.skipped += 1
                else:
                    counter.finished += 1
            if self._progress is not None:
                for key in (OVERALL, strategy):
                    if key in self._tasks:
                        self._progress.advance(self._tasks[key], 1)
            elif self.mode == "plain" and not skipped:
                self._write(self._cell_line(strategy, row, now))

    def close(self) -> None:
        """Stop the bars; ``plain`` ends with the run's count, resumed cells included."""
        if self._progress is not None:
            for key, task in self._tasks.items():
                if key in self.counters:
                    self._progress.update(task, total=self.counters[key].shown_total)
            self._progress.stop()
            self._progress = None
        elif self.mode == "plain" and OVERALL in self.counters:
            overall = self.counters[OVERALL]
            self.final = self.final or overall.done >= overall.total  # every announced cell is counted
            line = f"{self._head()} cells: {overall.finished} run now, {overall.skipped} found done on disk"
            if overall.done < overall.total:
                least = "" if self.final else "at least "
                line += f"; {least}{overall.total - overall.done} not run (run the same command again to resume)"
            self._write(line)

    # ----------------------------------------------------------------- plain lines

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def _head(self) -> str:
        """``[done/total pct]``, or ``[done/≥total]`` while the total may still grow."""
        overall = self.counters[OVERALL]
        total = overall.shown_total
        width = len(str(total))
        if not self.final:
            return f"[{overall.done:>{width}}/>={total}]"
        share = 100 * overall.done / total if total else 100
        return f"[{overall.done:>{width}}/{total} {share:3.0f}%]"

    def _cell_line(self, strategy: str, row: dict[str, Any] | None, now: float) -> str:
        overall = self.counters[OVERALL]
        head = self._head()
        if row is None:
            return f"{head} {strategy}: cell done  {format_eta(overall.eta(self.started, now))}"
        where = f"{strategy} b={row.get('budget')} r{row.get('repeat', 0)} {row.get('item_id')}"
        event = row.get("event")
        if event == "result":
            what = f"result quality={row.get('quality', 0):.2f} prompt={row.get('prompt_tokens')}"
            if row.get("latency_s") is not None and not row.get("cached"):
                what += f" {row['latency_s']:.1f}s"
        elif event == "violation":
            what = f"violation prompt={row.get('prompt_tokens')}>{row.get('budget')}"
        elif event == "admitted":
            what = f"admitted prompt={row.get('prompt_tokens')} (prompts only)"
        else:
            what = f"error ({row.get('phase', '?')}): {_short(str(row.get('cause', '')), 100)}"
        return f"{head} {where}  {what}  {format_eta(overall.eta(self.started, now))}"


def _episode_key(row: dict[str, Any]) -> tuple:
    return (row.get("strategy"), row.get("budget"), row.get("repeat", 0), row.get("item_id"))


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------- after the run


def _cause_group(row: dict[str, Any]) -> str:
    """An error cause without what differs from cell to cell (item id, numbers in addresses)."""
    cause = str(row.get("cause", "unknown"))
    item = str(row.get("item_id", ""))
    if item:
        cause = cause.replace(repr(item), "<item>").replace(item, "<item>")
    cause = re.sub(r"0x[0-9a-f]+", "0x…", cause)
    return f"{row.get('phase', '?')}: {_short(cause, 160)}"


@dataclass
class RunOutcome:
    """What the final table shows, computed from the run's terminal rows."""

    budgets: list[int]
    strategies: list[str]
    cells: dict[tuple[str, int], dict[str, Any]]
    errors: list[tuple[str, int]]
    audit_checked: int
    audit_mismatched: int
    audit_example: str | None
    prompts_only: bool = False  # no model call was made: admitted counts instead of quality


def outcome(
    rows: Iterable[dict[str, Any]], strategies: list[str], budgets: list[int], binary: bool, prompts_only: bool = False
) -> RunOutcome:
    """The cells come from the report's own ``summarise``, so the terminal shows the report's numbers;
    ``prompts_only``: the run sent nothing (``run --prompts-only``), so it has no quality to show."""
    from .report import summarise

    rows = list(rows)
    causes: Counter = Counter()
    checked = mismatched = 0
    example = None
    for row in rows:
        event = row["event"]
        if event not in ("result", "violation", "admitted"):
            causes[_cause_group(row)] += 1
        served = row.get("served_prompt_tokens")
        if event == "result" and served is not None:
            checked += 1
            if served != row.get("prompt_tokens"):
                mismatched += 1
                example = example or (
                    f"{served:,} served vs {row.get('prompt_tokens'):,} counted at "
                    f"{row['strategy']}@{row['budget']}, item {row['item_id']}"
                )
    cells = {
        (s, b): {
            "estimate": c["estimate"],
            "result": c.get("results", 0),
            "violation": c["violations"],
            "error": c["harness_errors"],
            "failed": c["plugin_errors"],
            "admitted": c.get("admitted", 0),
        }
        for (_, s, b), c in summarise(rows, binary, prompts_only).items()
    }
    return RunOutcome(budgets, strategies, cells, causes.most_common(), checked, mismatched, example, prompts_only)


def outcome_table(result: RunOutcome) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("strategy", no_wrap=True)
    for budget in result.budgets:
        table.add_column(str(budget), justify="right")
    for strategy in result.strategies:
        cells = []
        for budget in result.budgets:
            cell = result.cells.get((strategy, budget))
            if not cell:
                cells.append("-")
                continue
            estimate = cell["estimate"]
            if result.prompts_only:
                lines = [f"{cell.get('admitted', 0)}a"]
            elif estimate:
                lines = [f"{estimate.mean:.2f}", f"{estimate.low:.2f}-{estimate.high:.2f}"]
            else:
                lines = ["-"]
            marks = " ".join(f"{cell.get(k, 0)}{k[0]}" for k in ("violation", "failed", "error") if cell.get(k))
            if marks:
                lines.append(marks)
            cells.append("\n".join(lines))
        table.add_row(strategy, *cells)
    return table


def print_outcome(console: Console, result: RunOutcome) -> None:
    """The table, the grouped error causes and the served-count audit."""
    if result.prompts_only:
        heading = (
            "prompts only (no model call), by strategy and budget: a prompts admitted, v violations, "
            "f strategy failures, e harness errors (evidence recall: see the report)"
        )
    else:
        heading = (
            "quality by strategy and budget: mean, 95% interval; v violations (scored 0), "
            "f strategy failures (scored 0), e harness errors (cell incomplete; run again)"
        )
    console.print(heading, soft_wrap=True, highlight=False)
    console.print(outcome_table(result))
    if result.errors:
        console.print(f"[red]errors[/] ({sum(n for _, n in result.errors)} cells, by cause):")
        for cause, n in result.errors[:8]:
            console.print(f"  {n:>4} x {cause}", markup=False, highlight=False, soft_wrap=True)
        if len(result.errors) > 8:
            console.print(f"  ... and {len(result.errors) - 8} other causes (report: errors.csv)")
    if result.prompts_only:
        console.print("served-count audit: prompts only, no prompt was sent", soft_wrap=True)
    elif not result.audit_checked:
        console.print(
            "served-count audit: the server reported no prompt usage, so our counts are unchecked", soft_wrap=True
        )
    elif result.audit_mismatched:
        console.print(
            f"[yellow]served-count audit: {result.audit_mismatched} of {result.audit_checked} results "
            f"disagree[/] (e.g. {result.audit_example}): the tokenizer is not the served model's, or "
            "the server changed the prompt (Ollama cuts prompts to num_ctx)",
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print(
            f"served-count audit: the server's prompt count matched ours on all {result.audit_checked} results",
            soft_wrap=True,
        )
