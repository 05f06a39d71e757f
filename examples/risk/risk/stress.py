"""Stress scenarios: the portfolio's profit and loss under fixed shocks."""

from __future__ import annotations

from typing import TypedDict

from risk import data


class ScenarioResult(TypedDict):
    """One scenario's outcome.

    Attributes:
        scenario: The scenario's name.
        description: What it represents.
        pnl: The portfolio's profit (negative: loss) in USD.
    """

    scenario: str
    description: str
    pnl: float


class StressResult(TypedDict):
    """Outcomes of the stress scenarios, worst first.

    Attributes:
        results: Each scenario's profit and loss, worst first.
        worst: The name of the worst scenario.
    """

    results: list[ScenarioResult]
    worst: str


def stress_test(positions: dict[str, float], scenarios: list[str] | None = None) -> StressResult:
    """Profit and loss of a portfolio under the bundled stress scenarios.

    Each scenario shocks every risk factor at once (equity_crash, liquidity_shock, rates_up,
    dollar_rally); the portfolio's P&L is the sum of position times shock.

    Args:
        positions: Market value in USD per risk factor: us_equity, eu_equity, us_treasury_10y, eurusd (negative = short).
        scenarios: Names of the scenarios to run (default: all of them).

    Returns:
        Each scenario's P&L in USD, worst first.
    """
    table = data.scenarios()
    names = list(table.index) if scenarios is None else scenarios
    unknown = sorted(set(names) - set(table.index))
    if unknown or not names:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(table.index)}")
    exposure = data.exposures(positions)
    shocks = table.loc[names, list(exposure.index)]
    pnl = shocks @ exposure
    results = [
        ScenarioResult(scenario=str(name), description=str(table.loc[name, "description"]), pnl=float(pnl[name]))
        for name in pnl.sort_values().index
    ]
    return StressResult(results=results, worst=results[0]["scenario"])
