"""Historical value at risk and expected shortfall."""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np

from risk import data


class WorstDay(TypedDict):
    """The worst day of the history for the portfolio.

    Attributes:
        date: The day (YYYY-MM-DD).
        pnl: Its profit (negative: loss) in USD.
    """

    date: str
    pnl: float


class VarResult(TypedDict):
    """Historical value at risk of a portfolio.

    Attributes:
        var: Value at risk in USD, a positive number: the loss not exceeded with the given confidence over the horizon.
        expected_shortfall: Average loss in USD on the days beyond the VaR, scaled to the horizon.
        confidence: The confidence level used.
        horizon_days: The horizon in trading days.
        observations: How many days of history were used.
        worst_day: The worst day of the history for this portfolio.
    """

    var: float
    expected_shortfall: float
    confidence: float
    horizon_days: int
    observations: int
    worst_day: WorstDay


def historical_var(positions: dict[str, float], confidence: float = 0.99, horizon_days: int = 1) -> VarResult:
    """Historical value at risk and expected shortfall of a portfolio.

    Replays the bundled two years of daily factor returns on today's positions, takes the
    loss quantile at `confidence`, and scales it to the horizon by the square root of time.

    Args:
        positions: Market value in USD per risk factor: us_equity, eu_equity, us_treasury_10y, eurusd (negative = short).
        confidence: Confidence level, between 0.5 and 0.999 (0.99 = 99%).
        horizon_days: Horizon in trading days, 1 to 250.

    Returns:
        VaR and expected shortfall in USD (positive numbers are losses), with the worst day.
    """
    if not 0.5 <= confidence <= 0.999:
        raise ValueError(f"confidence must be between 0.5 and 0.999, not {confidence}")
    if not 1 <= horizon_days <= 250:
        raise ValueError(f"horizon_days must be between 1 and 250, not {horizon_days}")
    daily = data.pnl(positions)
    losses = -daily.to_numpy()
    var_1d = float(np.quantile(losses, confidence, method="linear"))
    tail = losses[losses >= var_1d]
    scale = math.sqrt(horizon_days)
    worst = daily.idxmin()
    return VarResult(
        var=var_1d * scale,
        expected_shortfall=float(tail.mean()) * scale,
        confidence=confidence,
        horizon_days=horizon_days,
        observations=len(losses),
        worst_day=WorstDay(date=str(worst), pnl=float(daily[worst])),
    )
