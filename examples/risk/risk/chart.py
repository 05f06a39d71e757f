"""A chart of the portfolio's historical profit and loss, returned as a PNG."""

from __future__ import annotations

import io
from typing import TypedDict

import numpy as np

from risk import data


class ChartResult(TypedDict):
    """What the chart shows.

    Attributes:
        var: The one-day value at risk in USD drawn on the chart (a positive number is a loss).
        confidence: The confidence level used.
        image: Name of the returned PNG.
    """

    var: float
    confidence: float
    image: str | None


def pnl_chart(positions: dict[str, float], confidence: float = 0.99) -> ChartResult:
    """Histogram of a portfolio's daily historical P&L with its value at risk marked, as a PNG.

    Args:
        positions: Market value in USD per risk factor: us_equity, eu_equity, us_treasury_10y, eurusd (negative = short).
        confidence: Confidence level of the VaR line, between 0.5 and 0.999.

    Returns:
        The VaR drawn, and the name of the PNG returned with the result.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    import toolyard

    if not 0.5 <= confidence <= 0.999:
        raise ValueError(f"confidence must be between 0.5 and 0.999, not {confidence}")
    daily = data.pnl(positions).to_numpy()
    var = float(np.quantile(-daily, confidence))
    figure = Figure(figsize=(6, 3.5), dpi=100)
    axes = figure.subplots()
    axes.hist(daily, bins=40, color="#4878a8")
    axes.axvline(-var, color="#c0392b", linestyle="--", label=f"{confidence:.0%} VaR: {var:,.0f} USD")
    axes.set_xlabel("daily P&L (USD)")
    axes.set_ylabel("days")
    axes.set_title("Historical daily P&L")
    axes.legend()
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png")
    return ChartResult(var=var, confidence=confidence, image=toolyard.image(png.getvalue(), name="pnl.png"))
