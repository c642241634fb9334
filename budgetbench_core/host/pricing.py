"""What a model call costs in dollars: ``--price IN/OUT`` or litellm's model cost map.

One rule everywhere, so every $ figure can be recomputed from the rows: cost = input tokens x
input price + output tokens x output price. A figure that is missing (a server that gave no
usage) makes the cost missing, never 0; the embedded model has no price (its cost is CPU
seconds, which the ledger shows instead).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

PER_MILLION = 1_000_000


class PriceError(ValueError):
    """A ``--price`` value that is not ``IN/OUT`` dollars per million tokens."""


@dataclass(frozen=True)
class Price:
    """Dollars per token, and where the figures came from (``--price`` or ``litellm:<key>``)."""

    input_per_token: float
    output_per_token: float
    source: str

    def cost(self, input_tokens: int | None, output_tokens: int | None) -> float | None:
        """Dollars for one call; None when either count is missing."""
        if input_tokens is None or output_tokens is None:
            return None
        return input_tokens * self.input_per_token + output_tokens * self.output_per_token

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_price(text: str) -> Price:
    """``"IN/OUT"`` in dollars per million input and output tokens, e.g. ``"0.15/0.6"``."""
    parts = text.split("/")
    try:
        if len(parts) != 2:
            raise ValueError
        figures = [float(part) for part in parts]
    except ValueError:
        raise PriceError(f"--price {text!r}: expected IN/OUT dollars per million tokens, e.g. 0.15/0.6") from None
    if not all(math.isfinite(f) and f >= 0 for f in figures):
        raise PriceError(f"--price {text!r}: prices must be finite and not negative")
    return Price(figures[0] / PER_MILLION, figures[1] / PER_MILLION, "--price")


def is_embedded(model: str) -> bool:
    """``--model local`` or ``local:<gguf>``: the embedded server, priced in CPU seconds."""
    return model == "local" or model.startswith("local:")


def price_for(model: str, price: str | None = None) -> Price | None:
    """The price of ``model``'s calls: ``price`` (``--price``) when given, else litellm's cost
    map; None for the embedded model and for a model litellm does not know."""
    if price is not None:
        return parse_price(price)
    if is_embedded(model):
        return None
    from ..builtin.litellm_backend import _litellm

    try:
        info = _litellm().get_model_info(model)
    except Exception:  # litellm raises a bare Exception for a model it has not mapped
        return None
    figures = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if not all(isinstance(f, (int, float)) for f in figures):
        return None
    return Price(float(figures[0]), float(figures[1]), f"litellm:{info.get('key') or model}")
