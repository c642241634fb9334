"""The judge audit card: known-answer probes from the task's own data, graded by the task's own
grader through a real judge (loopback fake judges for the lenient and strict cases, the embedded
model once), the card in the run directory and at the top of the report."""

import json
import re

import pytest

from budgetbench_core.report.judge_audit import (
    CARD_FILE,
    IDK,
    VAGUE,
    build_probes,
    judge_audit_section,
)
from budgetbench_core.testing import FaultServer, invoke_cli, shared_data

ORACLE = "longmemeval/longmemeval_oracle.json"
FAKE = "openai/fault-model"


def _oracle_items():
    from budgetbench_task_longmemeval.task import LongMemEval

    return list(LongMemEval(path=str(shared_data(ORACLE))).load(None, 0))


def _norm(text):
    return " ".join(re.sub(r"[^\w\s]", " ", str(text).lower()).split())


def lenient(messages):
    """A judge prompt that accepts anything: 'yes' to every question."""
    return "yes"


def strict(messages):
    """A careful judge for LongMemEval's official prompts: yes only when the response names the
    gold answer, or (abstention prompt) when it says it does not know."""
    prompt = messages[-1]["content"]
    response = prompt.split("Model Response:", 1)[1].rsplit("\n\n", 1)[0]
    if "Explanation:" in prompt:
        return "yes" if "don't know" in response else "no"
    gold = re.split(r"Correct Answer:|Rubric:", prompt, maxsplit=1)[1].split("Model Response:", 1)[0]
    return "yes" if f" {_norm(gold)} " in f" {_norm(response)} " else "no"


def _audit(url, *args):
    return invoke_cli(
        "judge-audit",
        *args,
        "--judge-model",
        FAKE,
        "--judge-api-base",
        url,
        "--timeout",
        "10",
        env={"OPENAI_API_KEY": "sk-test"},
    )


def _task_args():
    return ("-t", "longmemeval", "--task-option", f"path={shared_data(ORACLE)}")


def test_probes_are_built_from_the_task_data_with_known_verdicts():
    items = _oracle_items()
    probes = build_probes(items, 100, seed=3)
    kinds = {}
    for probe in probes:
        kinds.setdefault(probe.kind, []).append(probe)
    assert {k: len(v) for k, v in kinds.items()} == {
        "gold": 100,
        "other_gold": 100,
        "vague": 100,
        "idk_answerable": 100,
        "idk_abstention": 30,  # every abstention question of the oracle split
    }
    assert all(not p.item.history for p in probes)  # the answer is graded, not the conversation
    assert all(p.response == str(p.item.answer) for p in kinds["gold"])
    for probe in kinds["other_gold"] + kinds["vague"]:
        gold, said = _norm(probe.item.answer), _norm(probe.response)
        assert f" {gold} " not in f" {said} " and f" {said} " not in f" {gold} ", probe
    assert all(p.item.metadata["abstention"] and p.response == IDK for p in kinds["idk_abstention"])
    assert not any(p.item.metadata["abstention"] for p in kinds["idk_answerable"])
    vague = {answer for answers in VAGUE.values() for answer in answers}
    assert all(p.response in vague for p in kinds["vague"])
    for form, word in (("count", "how many"), ("duration", "how long"), ("frequency", "how often")):
        asked = [p for p in kinds["vague"] if word in p.item.metadata["question"].lower()]
        assert asked and all(p.response in VAGUE[form] for p in asked), form  # shaped like the question
    # other answers come from the same category where one exists
    by_answer = {str(i.answer): i.category for i in items}
    same = sum(by_answer[p.response] == p.item.category for p in kinds["other_gold"])
    assert same >= 90
    again = build_probes(items, 100, seed=3)
    assert [(p.kind, p.item.id, p.response) for p in again] == [(p.kind, p.item.id, p.response) for p in probes]
    assert [p.item.id for p in build_probes(items, 100, seed=4)] != [p.item.id for p in probes]


def test_a_lenient_judge_fails_the_card_and_the_report_says_so_at_the_top(tmp_path):
    run_dir = tmp_path / "run"
    with FaultServer(reply=lenient, count_prompt=lambda m: sum(len(x["content"].split()) for x in m)) as server:
        ran = invoke_cli(
            "run",
            *_task_args(),
            "-s",
            "truncation",
            "-b",
            "1024",
            "-n",
            "2",
            "-m",
            FAKE,
            "--api-base",
            server.url,
            "--tokenizer",
            "tiktoken:cl100k_base",
            "--no-preflight",
            "--no-report",
            "-o",
            str(run_dir),
            env={"OPENAI_API_KEY": "sk-test"},
        )
        assert ran.exit_code == 0, ran.output
        before = server.completions()
        # the run's own judge (its served model): the manifest names task, grader and judge
        audited = invoke_cli("judge-audit", str(run_dir), "-n", "20", env={"OPENAI_API_KEY": "sk-test"})
        served = [r.prompt_tokens for r in server.requests[before:]]
    assert audited.exit_code == 1, audited.output
    card = json.loads((run_dir / CARD_FILE).read_text())
    kinds = {k["kind"]: k for k in card["kinds"]}
    assert kinds["vague"]["rate"] == 1.0 and kinds["vague"]["n"] == 20 and kinds["vague"]["passes"] is False
    assert kinds["vague"]["low"] > 0.8  # the interval, not only the point, is far above 10%
    assert card["failures"] == ["other_gold", "vague", "idk_answerable"] and not card["passed"]
    assert card["judge_model"] == FAKE and card["grader"]["name"] == "longmemeval-judge"
    # the judge's calls counted apart, with the judge server's own token counts
    assert card["cost"]["calls"] == len(served) == len(card["probes"])
    assert card["cost"]["prompt_tokens"] == sum(served) > 0
    assert "THE JUDGE FAILS ITS AUDIT CARD" in audited.output
    assert "The judge accepts vague answers naming no specific fact 100% [" in audited.output

    reported = invoke_cli("report", str(run_dir), "--format", "md", "--format", "json")
    assert reported.exit_code == 0, reported.output
    md = (run_dir / "report" / "report.md").read_text()
    head = md.split("## Findings")[0]
    assert "THE JUDGE FAILS ITS AUDIT CARD" in head  # in the header, at the top
    findings = md.split("## Findings", 1)[1].lstrip().splitlines()
    assert findings[0].startswith("- THE JUDGE FAILS ITS AUDIT CARD (openai/fault-model): ")
    assert any("The judge accepts vague answers naming no specific fact 100% [" in line for line in findings)
    body = json.loads((run_dir / "report" / "report.json").read_text())
    assert body["judge_audit"]["failures"] == card["failures"] and "probes" not in body["judge_audit"]


def test_a_strict_judge_passes_the_card(tmp_path):
    with FaultServer(reply=strict) as server:
        result = _audit(server.url, *_task_args(), "-n", "30", "--json", "-o", str(tmp_path / "card.json"))
    assert result.exit_code == 0, result.output
    card = json.loads((tmp_path / "card.json").read_text())
    assert card["passed"] and not card["failures"]
    rates = {k["kind"]: (k["rate"], k["n"]) for k in card["kinds"]}
    assert rates["gold"][0] >= 0.9 and rates["idk_abstention"] == (1.0, 30)
    assert rates["vague"] == (0.0, 30) and rates["idk_answerable"] == (0.0, 30)
    assert rates["other_gold"][0] <= 0.1
    assert json.loads(result.stdout)["kinds"] == card["kinds"]  # --json prints the card written


def test_a_grader_without_a_judge_has_nothing_to_audit():
    with FaultServer(reply=lenient) as server:
        result = _audit(server.url, *_task_args(), "-g", "longmemeval-match", "-n", "5")
        assert server.completions() == 0
    assert result.exit_code == 2 and "asks no judge" in result.output


def test_a_judged_run_without_a_card_points_to_the_command(tmp_path):
    judged = [{"verdict": {"judge_model": "gpt-4o-2024-08-06", "label": True}}]
    section = judge_audit_section(tmp_path, judged)
    assert section.banner is None and len(section.lines) == 1
    assert f"budgetbench judge-audit {tmp_path}" in section.lines[0]
    context = {"findings": ["other"], "header": {"grader": "g"}}
    section.add_to(context)
    assert context["findings"][1] == "other" and context["header"]["grader"] == "g"
    plain = {"findings": ["other"], "header": {"grader": "g"}}
    judge_audit_section(tmp_path, [{"verdict": {"normalized_prediction": "x"}}]).add_to(plain)
    assert plain == {"findings": ["other"], "header": {"grader": "g"}}  # no judge: no card, nothing said


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_embedded_model_judges_a_few_probes_with_the_official_grader(tmp_path):
    result = invoke_cli(
        "judge-audit", *_task_args(), "--judge-model", "local", "-n", "2", "-j", "1", "-o", str(tmp_path / "c.json")
    )
    assert result.exit_code in (0, 1), result.output  # a 135M judge may well fail; the card is made
    card = json.loads((tmp_path / "c.json").read_text())
    assert sum(k["n"] for k in card["kinds"]) == len(card["probes"]) == 2 * 4 + 2
    assert all("raw_verdict" in p["detail"] for p in card["probes"])  # every probe asked the real judge
    assert card["cost"]["calls"] == 10 and card["cost"]["unreported_calls"] == 0
    assert card["cost"]["prompt_tokens"] > 10 * 50  # the embedded server's own counts of the judge prompts
    assert card["grader"]["version"] == "longmemeval-evaluate_qa@f466efe"
