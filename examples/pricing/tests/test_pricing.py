"""Pricing example: Black-Scholes values and Greeks, quote lookups, and manifest drift."""

from __future__ import annotations

import math
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from pricing import quotes
from pricing.options import calc_greeks, price_option

EXAMPLE = Path(__file__).resolve().parents[1]
BASE = {"spot": 100.0, "strike": 100.0, "time_to_expiry": 1.0, "volatility": 0.2, "rate": 0.05}
CASES = [
    {**BASE, "option_type": "call"},
    {**BASE, "option_type": "put"},
    {**BASE, "spot": 92.0, "strike": 105.0, "time_to_expiry": 0.4, "dividend_yield": 0.03, "option_type": "call"},
    {**BASE, "spot": 130.0, "volatility": 0.35, "rate": 0.01, "dividend_yield": 0.02, "option_type": "put"},
]


def test_textbook_call_value():
    result = price_option(**BASE)
    assert round(result.price, 4) == 10.4506
    assert result.option_type == "call"


def test_textbook_put_value():
    assert round(price_option(**BASE, option_type="put").price, 4) == 5.5735


@pytest.mark.parametrize("q", [0.0, 0.03, 0.08])
def test_put_call_parity_with_dividends(q):
    args = {**BASE, "spot": 97.0, "strike": 103.0, "time_to_expiry": 0.75, "dividend_yield": q}
    call = price_option(**args, option_type="call").price
    put = price_option(**args, option_type="put").price
    forward_gap = 97.0 * math.exp(-q * 0.75) - 103.0 * math.exp(-0.05 * 0.75)
    assert call - put == pytest.approx(forward_gap, abs=1e-10)


def bumped(args: dict, name: str, h: float) -> float:
    """Central difference of the price in one input."""
    up = price_option(**{**args, name: args[name] + h}).price
    down = price_option(**{**args, name: args[name] - h}).price
    return (up - down) / (2 * h)


@pytest.mark.parametrize("args", CASES)
def test_greeks_match_finite_differences(args):
    greeks = calc_greeks(**args)
    h = 1e-3
    assert greeks.delta == pytest.approx(bumped(args, "spot", h), rel=1e-6)
    up = price_option(**{**args, "spot": args["spot"] + h}).price
    mid = price_option(**args).price
    down = price_option(**{**args, "spot": args["spot"] - h}).price
    assert greeks.gamma == pytest.approx((up - 2 * mid + down) / h**2, rel=1e-4)
    assert greeks.vega == pytest.approx(bumped(args, "volatility", 1e-5), rel=1e-6)  # per 1.00 of vol
    assert greeks.rho == pytest.approx(bumped(args, "rate", 1e-5), rel=1e-6)  # per 1.00 of rate
    # Theta per calendar day: the value change as one day passes (time to expiry shrinks).
    per_year = -bumped(args, "time_to_expiry", 1e-5)
    assert greeks.theta == pytest.approx(per_year / 365, rel=1e-6)


def test_theta_scale_and_sign():
    theta = calc_greeks(**BASE).theta
    one_day_later = price_option(**{**BASE, "time_to_expiry": 1 - 1 / 365}).price
    assert theta < 0
    assert theta == pytest.approx(one_day_later - price_option(**BASE).price, rel=1e-3)


def test_call_and_put_deltas_differ_by_the_dividend_discount():
    args = {**BASE, "dividend_yield": 0.04}
    call, put = calc_greeks(**args, option_type="call"), calc_greeks(**args, option_type="put")
    assert call.delta - put.delta == pytest.approx(math.exp(-0.04))
    assert call.gamma == pytest.approx(put.gamma) and call.vega == pytest.approx(put.vega)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"spot": 0.0}, "spot must be a positive number, got 0.0"),
        ({"strike": -5.0}, "strike must be a positive number, got -5.0"),
        ({"time_to_expiry": 0.0}, "time_to_expiry must be a positive number, got 0.0"),
        ({"volatility": -0.2}, "volatility must be a positive number, got -0.2"),
        ({"rate": math.nan}, "rate must be a finite number, got nan"),
        ({"option_type": "straddle"}, "option_type must be 'call' or 'put', got 'straddle'"),
    ],
)
@pytest.mark.parametrize("function", [price_option, calc_greeks])
def test_invalid_inputs_raise_value_error(function, change, message):
    with pytest.raises(ValueError) as info:
        function(**{**BASE, **change})
    assert str(info.value) == message


def test_both_quote_lookups_agree():
    table = quotes.load_quotes()
    assert len(table) >= 10
    for symbol in table:
        assert quotes.get_quote(symbol) == quotes.get_quote_fresh(symbol.lower())
    quote = quotes.get_quote("aapl")
    assert asdict(quote).keys() == {"symbol", "bid", "ask", "last", "currency"}
    assert quote.bid <= quote.last <= quote.ask


def test_get_quote_reads_the_file_once_per_process():
    quotes._cached_quotes.cache_clear()
    for _ in range(3):
        quotes.get_quote("MSFT")
    assert quotes._cached_quotes.cache_info().misses == 1


@pytest.mark.parametrize("lookup", [quotes.get_quote, quotes.get_quote_fresh])
def test_unknown_symbol(lookup):
    with pytest.raises(LookupError) as info:
        lookup("XYZ")
    assert str(info.value).startswith("unknown symbol 'XYZ'; known: 7203, AAPL, AMZN, ")


def test_committed_manifest_matches_the_code(tmp_path):
    regenerated = tmp_path / "tools.yaml"
    proc = subprocess.run(["bash", str(EXAMPLE / "generate.sh"), str(regenerated)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert regenerated.read_text() == (EXAMPLE / "tools.yaml").read_text(), (
        "examples/pricing/tools.yaml is stale: run examples/pricing/generate.sh"
    )
