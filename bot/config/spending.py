"""``[[prices]]`` and ``[limits]`` (SPEC §17 spending caps): what a million tokens of each model cost, and each person's
daily caps. The agents' own caps are ``[[agents]]`` keys (bot.config.agents)."""

from __future__ import annotations

from pydantic import Field

from bot.config.table import Table, Text
from core.spending import PersonCaps, Price


class PriceTable(Table):
    """What one model's tokens cost (any one currency, the same in every table and cap)."""

    model: Text = Field(description="the model's name exactly as LLM_MODEL, LLM_FALLBACK_MODEL or an agent's model "
                                    "says it")
    input_per_million: float = Field(ge=0, le=1_000_000, description="a number ≥ 0: the price of a million input "
                                                                     "tokens")
    output_per_million: float = Field(ge=0, le=1_000_000, description="a number ≥ 0: the price of a million output "
                                                                      "tokens")

    def price(self) -> Price:
        return Price(self.input_per_million, self.output_per_million)


class LimitsTable(Table):
    """Caps on what each person's turns may spend, across agents, per UTC day."""

    person_daily_tokens: int | None = Field(None, ge=1, description="an integer ≥ 1: the tokens one person's turns "
                                                                    "may use per UTC day (default no cap)")
    person_daily_cost: float | None = Field(None, gt=0, allow_inf_nan=False,  # finite: inf would fail every call
                                            description="a number > 0: what one person's turns may cost per UTC "
                                                        "day, priced by [[prices]] (default no cap)")

    def caps(self) -> PersonCaps:
        return PersonCaps(self.person_daily_tokens, self.person_daily_cost)
