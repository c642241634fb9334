"""The official LongMemEval judge prompts, one per question type, and how a verdict is read.

Reviewed text: these are the prompts of the LongMemEval evaluator
(github.com/xiaowu0162/LongMemEval, src/evaluation/evaluate_qa.py, get_anscheck_prompt,
commit f466efe), word for word, including their spacing, so a score here means what the
paper's score means. The upstream evaluator asks the judge with temperature 0 and
max_tokens 10, and a verdict is correct when "yes" appears anywhere in the lower-cased,
stripped reply (so a reply such as "eyes" counts as yes; that is the official rule and is
kept). Abstention questions (``_abs`` in the id) use the abstention prompt whatever their
type. Change any text here only with a new PROMPT_VERSION.
"""

from __future__ import annotations

PROMPT_VERSION = "longmemeval-evaluate_qa@f466efe"
JUDGE_MAX_TOKENS = 10  # as upstream
OFFICIAL_JUDGE_MODEL = "gpt-4o-2024-08-06"  # the model print_qa_metrics.py requires

_CORRECT_ANSWER = (
    "I will give you a question, a correct answer, and a response from a model. Please answer yes if the "
    "response contains the correct answer. Otherwise, answer no."
)
_INTERMEDIATE_STEPS = (
    " If the response is equivalent to the correct answer or contains all the intermediate steps to get the "
    "correct answer, you should also answer yes. If the response only contains a subset of the information "
    "required by the answer, answer no."
)
_OFF_BY_ONE = (
    " In addition, do not penalize off-by-one errors for the number of days. If the question asks for the "
    "number of days/weeks/months, etc., and the model makes off-by-one errors (e.g., predicting 19 days when the "
    "answer is 18), the model's response is still correct."
)
_UPDATED_ANSWER = (
    " If the response contains some previous information along with an updated answer, the response should be "
    "considered as correct as long as the updated answer is the required answer."
)
_GRADED_TAIL = (
    "\n\nQuestion: {question}\n\nCorrect Answer: {answer}\n\nModel Response: {response}\n\n"
    "Is the model response correct? Answer yes or no only."
)

TEMPLATES = {
    # single-session-user, single-session-assistant and multi-session share one prompt upstream.
    "single-session-user": _CORRECT_ANSWER + _INTERMEDIATE_STEPS + " " + _GRADED_TAIL,
    "single-session-assistant": _CORRECT_ANSWER + _INTERMEDIATE_STEPS + " " + _GRADED_TAIL,
    "multi-session": _CORRECT_ANSWER + _INTERMEDIATE_STEPS + " " + _GRADED_TAIL,
    "temporal-reasoning": _CORRECT_ANSWER + _INTERMEDIATE_STEPS + _OFF_BY_ONE + " " + _GRADED_TAIL,
    "knowledge-update": _CORRECT_ANSWER + _UPDATED_ANSWER + _GRADED_TAIL,
    "single-session-preference": (
        "I will give you a question, a rubric for desired personalized response, and a response from a model. "
        "Please answer yes if the response satisfies the desired response. Otherwise, answer no. The model does "
        "not need to reflect all the points in the rubric. The response is correct as long as it recalls and "
        "utilizes the user's personal information correctly."
        "\n\nQuestion: {question}\n\nRubric: {answer}\n\nModel Response: {response}\n\n"
        "Is the model response correct? Answer yes or no only."
    ),
    "abstention": (
        "I will give you an unanswerable question, an explanation, and a response from a model. Please answer yes "
        "if the model correctly identifies the question as unanswerable. The model could say that the information "
        "is incomplete, or some other information is given but the asked information is not."
        "\n\nQuestion: {question}\n\nExplanation: {answer}\n\nModel Response: {response}\n\n"
        "Does the model correctly identify the question as unanswerable? Answer yes or no only."
    ),
}


def prompt_kind(question_type: str, abstention: bool) -> str:
    """Which template grades this question: the abstention one first, then by type."""
    if abstention:
        return "abstention"
    if question_type not in TEMPLATES:
        raise ValueError(f"no LongMemEval judge prompt for question type {question_type!r}")
    return question_type


def judge_prompt(question_type: str, question: str, answer: object, response: str, abstention: bool) -> str:
    """The judge's single user message for one prediction."""
    template = TEMPLATES[prompt_kind(question_type, abstention)]
    return template.format(question=question, answer=answer, response=response)


def read_verdict(reply: str) -> bool:
    """The official label: "yes" appears in the stripped, lower-cased reply."""
    return "yes" in reply.strip().lower()
