"""The bundled data: daily returns of the risk factors and the stress scenarios."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent


@functools.cache
def returns() -> pd.DataFrame:
    """Daily returns, one column per risk factor, indexed by date (loaded once per process)."""
    return pd.read_csv(HERE / "returns.csv", index_col="date")


@functools.cache
def scenarios() -> pd.DataFrame:
    """Stress scenarios: a description and a shock (a return) per risk factor, by name."""
    return pd.read_csv(HERE / "scenarios.csv", index_col="scenario")


def exposures(positions: dict[str, float]) -> pd.Series:
    """The positions as a vector over every factor (0 where none is held).

    Raises ValueError for an empty portfolio, an unknown factor or a position that is not a
    finite number.
    """
    factors = list(returns().columns)
    if not positions:
        raise ValueError(f"positions is empty: give a market value for at least one of {', '.join(factors)}")
    unknown = sorted(set(positions) - set(factors))
    if unknown:
        raise ValueError(f"unknown risk factor(s) {', '.join(unknown)}; known: {', '.join(factors)}")
    vector = pd.Series(0.0, index=factors)
    for factor, value in positions.items():
        if not np.isfinite(value):
            raise ValueError(f"the position in {factor} must be a finite number")
        vector[factor] = float(value)
    return vector


def pnl(positions: dict[str, float]) -> pd.Series:
    """The portfolio's daily profit and loss over the history, in USD, by date."""
    return returns() @ exposures(positions)
