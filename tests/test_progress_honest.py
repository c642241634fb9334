"""What the run display counts: totals said as "at least" until the task has no more items, a
count that never passes its total, a resumed run that ends at 100%, and an agent episode's
turns shown as they end (issue 30: 48 cells announced then 720 run; [36/40] at the end of a
resume; [231/210 110%]; seven silent minutes of an episode in the plain display)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from budgetbench_core.progress import OVERALL, Display


def row(item: str, event: str = "result", **extra) -> dict:
    return {"strategy": "truncation", "event": event, "budget": 512, "repeat": 0, "item_id": item, **extra}


def plain() -> Display:
    return Display("plain", stream=io.StringIO())


def lines(screen: Display) -> list[str]:
    return screen.stream.getvalue().splitlines()


def test_a_streamed_total_is_at_least_until_the_task_is_read_to_the_end():
    screen = plain()
    screen.start(48, {"truncation": 48}, final=False)
    screen.finished(row("a", quality=1.0, prompt_tokens=300))
    screen.progress("truncation", 1)
    screen.start(720, {"truncation": 720}, final=True)
    screen.finished(row("b", quality=0.0, prompt_tokens=300))
    screen.progress("truncation", 1)
    out = lines(screen)
    assert out[0] == "run: at least 48 cells so far (truncation 48); more as the task's items are read"
    assert out[1].startswith("[ 1/>=48] truncation b=512 r0 a  result")
    assert out[2] == "run: 720 cells in all (truncation 720)"
    assert out[3].startswith("[  2/720   0%] truncation b=512 r0 b  result")


def test_a_count_never_runs_past_its_total():
    """Cells found done on disk may be counted before the items they belong to are announced."""
    screen = plain()
    screen.start(210, {"truncation": 210}, final=False)
    screen.progress("truncation", 231)
    screen.close()
    out = lines(screen)
    assert out[0] == "run: at least 210 cells so far (truncation 210); more as the task's items are read"
    assert out[-1] == "[231/231 100%] cells: 0 run now, 231 found done on disk"  # all counted: the total is known


def test_a_resumed_run_ends_at_100_percent():
    """The last cells found done on disk come after the last finished cell's line: the closing line counts them."""
    screen = plain()
    screen.start(40, {"truncation": 40}, final=True)
    for index in range(36):
        screen.finished(row(f"i{index}", quality=1.0, prompt_tokens=300))
        screen.progress("truncation", 1)
    screen.progress("truncation", 4)
    screen.close()
    out = lines(screen)
    assert out[-2].startswith("[36/40  90%]")
    assert out[-1] == "[40/40 100%] cells: 36 run now, 4 found done on disk"
    assert screen.counters[OVERALL].done == screen.counters["truncation"].done == 40


def test_a_run_stopped_while_its_task_was_still_read_says_at_least():
    screen = plain()
    screen.start(48, {"truncation": 48})  # the runner did not say the task was read to the end
    screen.finished(row("a", quality=1.0, prompt_tokens=300))
    screen.progress("truncation", 1)
    screen.close()
    assert lines(screen)[-1] == (
        "[ 1/>=48] cells: 1 run now, 0 found done on disk; at least 47 not run (run the same command again to resume)"
    )


def test_a_stopped_run_says_how_many_cells_it_did_not_run():
    screen = plain()
    screen.start(10, {"truncation": 10}, final=True)
    screen.finished(row("a", quality=1.0, prompt_tokens=300))
    screen.progress("truncation", 1)
    screen.close()
    assert (
        lines(screen)[-1]
        == "[ 1/10  10%] cells: 1 run now, 0 found done on disk; 9 not run (run the same command again to resume)"
    )


def turn(n: int, **extra) -> dict:
    return {**row("task-7"), "turn": n, "max_turns": 30, "prompt_tokens": 900 + n, **extra}


def test_plain_prints_each_turn_of_an_episode_as_it_ends():
    screen = plain()
    screen.start(2, {"truncation": 2}, final=True)
    screen.turn(turn(1, latency_s=12.34))
    screen.turn(turn(2, cached=True, latency_s=0.0))
    screen.finished(row("task-7", quality=1.0, prompt_tokens=902))
    out = lines(screen)
    assert out[1] == "[0/2   0%] truncation b=512 r0 task-7  turn 1/30 prompt=901 12.3s"
    assert out[2] == "[0/2   0%] truncation b=512 r0 task-7  turn 2/30 prompt=902 (cached)"
    assert out[3].startswith("[1/2  50%] truncation b=512 r0 task-7  result")


def test_rich_shows_an_episode_row_until_its_cell_finishes():
    stream = io.StringIO()
    screen = Display("rich", console=Console(file=stream, force_terminal=True, width=120))
    screen.start(2, {"truncation": 2}, final=True)
    screen.turn(turn(1, latency_s=3.0))
    screen.turn(turn(2, latency_s=4.0))
    assert len(screen._episodes) == 1
    screen.finished(row("task-7", quality=1.0, prompt_tokens=902))
    assert not screen._episodes
    screen.turn({**turn(1, latency_s=5.0), "item_id": "task-8"})
    screen.close()
    text = stream.getvalue()
    assert "truncation b=512 r0 task-8" in text and "turn 1/30 prompt=901 5.0s" in text
    assert "1/2" in text


def test_no_display_prints_no_turn():
    screen = Display("none", stream=io.StringIO())
    screen.start(1, {"truncation": 1}, final=True)
    screen.turn(turn(1, latency_s=1.0))
    assert screen.stream.getvalue() == ""


def test_cells_found_done_before_the_first_announcement_are_kept():
    """A resume of a finished run: every item is found done while the task is read, before any total is known."""
    screen = plain()
    screen.progress("truncation", 30)
    screen.start(30, {"truncation": 30}, final=True)
    screen.close()
    assert lines(screen)[-1] == "[30/30 100%] cells: 0 run now, 30 found done on disk"
    stream = io.StringIO()
    rich = Display("rich", console=Console(file=stream, force_terminal=True, width=120))
    rich.progress("truncation", 30)
    rich.start(30, {"truncation": 30}, final=True)
    rich.close()
    assert "30/30" in stream.getvalue() and not re.search(r"(?<!\d)0/30", stream.getvalue())
