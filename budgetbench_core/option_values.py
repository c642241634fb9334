"""Parsers of option values the command line, ``--config`` and plugin commands share
(``KEY=VALUE`` pairs, budget tiers): their own module, so a command outside ``cli`` uses them
without importing the command group (which imports every command: an import cycle)."""

from __future__ import annotations

import json
import re

import click

SECRET_OPTION_HINT = (
    "API keys are never taken on the command line (they would land in shell history and logs). "
    "Set the provider's environment variable instead, e.g. OPENAI_API_KEY or OPENROUTER_API_KEY."
)


def parse_pairs(values: tuple[str, ...], option: str) -> dict[str, object]:
    """``key=value`` pairs; values parsed as JSON when they are valid JSON, else kept as text."""
    parsed: dict[str, object] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {raw!r}", param_hint=option)
        if "key" in key.lower() and "api" in key.lower():
            raise click.UsageError(SECRET_OPTION_HINT)
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
    return parsed


def parse_strategy_params(values: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """``strategy.key=value`` pairs grouped by strategy."""
    grouped: dict[str, dict[str, object]] = {}
    for key, value in parse_pairs(values, "--strategy-param").items():
        strategy, dot, name = key.partition(".")
        if not dot:
            raise click.BadParameter(f"expected strategy.key=value, got {key!r}", param_hint="--strategy-param")
        grouped.setdefault(strategy, {})[name] = value
    return grouped


_BUDGET = re.compile(r"^(\d+(?:\.\d+)?)([kK]?)$")


def parse_budgets(text: str) -> list[int]:
    """``"2048 4096"``, ``"2048,4096"`` or ``"2k 4k"`` (k = 1024) as a list of positive integers."""
    budgets = []
    for part in text.replace(",", " ").split():
        match = _BUDGET.match(part)
        value = float(match.group(1)) * (1024 if match.group(2) else 1) if match else None
        if value is None or value != int(value) or value <= 0:
            raise click.BadParameter(
                f"{part!r} is not a budget; give positive token counts like 2048 or 2k", param_hint="--budgets"
            )
        budgets.append(int(value))
    if not budgets:
        raise click.BadParameter("give at least one positive budget", param_hint="--budgets")
    return budgets
