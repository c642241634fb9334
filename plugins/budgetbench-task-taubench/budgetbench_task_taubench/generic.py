"""The generic tools several domains list alike (upstream defines them in each domain's class).

A domain lists one by naming it in its class body (``calculate = generic.calculate``);
:class:`~.toolkit.Toolkit` then gives that class its own copy, so a wrong call's ``TypeError``
text names the domain's class (``RetailTools.calculate() ...``) as upstream's does.
"""

from __future__ import annotations

from .toolkit import GENERIC, calculate_expression, tool


@tool(
    GENERIC,
    "Calculate the result of a mathematical expression.",
    {
        "expression": "The mathematical expression to calculate, such as '2 + 2'. The expression can contain "
        "numbers, operators (+, -, *, /), parentheses, and spaces."
    },
)
def calculate(self, expression: str) -> str:
    return calculate_expression(expression)


@tool(
    GENERIC,
    "Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the "
    "user explicitly asks for a human agent, or if given the policy and the available tools you "
    "cannot solve the user's issue.",
    {"summary": "A summary of the user's issue."},
)
def transfer_to_human_agents(self, summary: str) -> str:
    return "Transfer successful"
