"""The errata file: its format is checked, the ceiling is in the manifest, graders score both keys."""

import json

import pytest
from budgetbench_task_locomo.graders import LoCoMoF1
from budgetbench_task_locomo.task import LoCoMo

from budgetbench_core import GradingContext, TaskDataError


def write(tmp_path, errata):
    path = tmp_path / "errata.json"
    path.write_text(json.dumps(errata))
    return str(path)


def test_scores_with_and_without_the_errata_and_the_ceiling(locomo_file, tmp_path):
    errata = {"conv-26_q000": "8 May 2023", "conv-26_q001": "exclude", "conv-26_q152": "exclude"}
    task = LoCoMo(path=str(locomo_file), errata=write(tmp_path, errata))
    items = {i.id: i for i in task.load(None, 0)}
    notes = task.manifest_notes()["errata"]
    # conv-26_q152 is category 5, excluded by default: the ceiling counts the selected questions only
    assert notes["questions"] == 1540 and notes["corrected"] == 1 and notes["excluded"] == 1
    assert notes["known_wrong_share"] == round(2 / 1540, 6) and notes["ceiling"] == round(1 - 2 / 1540, 6)
    context = GradingContext(judge=lambda messages, max_tokens: "", judge_model=None)
    verdict = LoCoMoF1().grade(items["conv-26_q000"], "8 May 2023", context)
    assert verdict.quality == pytest.approx(2 / 3) and verdict.detail["errata"] == {
        "answer": "8 May 2023",
        "quality": 1.0,
    }
    assert LoCoMoF1().grade(items["conv-26_q001"], "x", context).detail["errata"] == {"excluded": True}
    assert "errata" not in LoCoMoF1().grade(items["conv-26_q002"], "x", context).detail
    assert task.data_files()[-1].name == "errata.json"  # part of the run identity


@pytest.mark.parametrize(
    "errata, problem",
    [
        ({"conv-26_q999": "x"}, "'conv-26_q999' is not a question of the data file"),
        ({"conv-26_q000": ""}, "must be a corrected answer or 'exclude'"),
        (["conv-26_q000"], "an errata file is a JSON object"),
        ({"conv-26_q152": "Yes"}, "category 5 .* its only erratum can be 'exclude'"),
    ],
)
def test_bad_errata_files_are_named(locomo_file, tmp_path, errata, problem):
    with pytest.raises((TaskDataError, ValueError), match=problem):
        list(LoCoMo(path=str(locomo_file), errata=write(tmp_path, errata)).load(None, 0))
