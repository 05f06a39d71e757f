"""European option pricing with the Black-Scholes-Merton model (continuous dividend yield).

Rates, yields and volatilities are decimals (0.05 means 5%), times are in years.
Only the standard library is used: the normal CDF comes from `math.erfc`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

OptionType = Literal["call", "put"]


@dataclass(frozen=True)
class OptionPrice:
    """Price of a European option.

    Attributes:
        price: Fair value of one option, in the currency of the underlying.
        option_type: Which option was priced: "call" or "put".
    """

    price: float
    option_type: OptionType


@dataclass(frozen=True)
class Greeks:
    """Sensitivities of a European option's price.

    Attributes:
        delta: Change in price per 1.00 change in the underlying's price.
        gamma: Change in delta per 1.00 change in the underlying's price.
        theta: Change in price per calendar day that passes (annual theta / 365); usually negative.
        vega: Change in price per 1.00 (that is, 100 percentage points) change in volatility;
            divide by 100 for one volatility point.
        rho: Change in price per 1.00 (100 percentage points) change in the risk-free rate;
            divide by 100 for one percentage point.
    """

    delta: float
    gamma: float
    theta: float
    vega: float
    rho: float


def price_option(
    spot: float,
    strike: float,
    time_to_expiry: float,
    volatility: float,
    rate: float,
    dividend_yield: float = 0.0,
    option_type: OptionType = "call",
) -> OptionPrice:
    """Price a European call or put option with the Black-Scholes-Merton formula.

    Assumes lognormal prices, constant volatility and rates, and a continuous dividend
    yield. Not for American options (early exercise is ignored).

    Args:
        spot: Current price of the underlying asset; must be positive.
        strike: Strike (exercise) price of the option; must be positive.
        time_to_expiry: Time until expiry in years (0.5 = six months); must be positive.
        volatility: Annualised volatility as a decimal (0.2 = 20%); must be positive.
        rate: Continuously compounded risk-free interest rate as a decimal (0.05 = 5%).
        dividend_yield: Continuous dividend yield of the underlying as a decimal (0.02 = 2%).
        option_type: "call" (right to buy) or "put" (right to sell).

    Returns:
        The option's fair value per unit of the underlying.
    """
    d1, d2 = _d1_d2(spot, strike, time_to_expiry, volatility, rate, dividend_yield, option_type)
    spot_df = spot * math.exp(-dividend_yield * time_to_expiry)
    strike_df = strike * math.exp(-rate * time_to_expiry)
    if option_type == "call":
        price = spot_df * _cdf(d1) - strike_df * _cdf(d2)
    else:
        price = strike_df * _cdf(-d2) - spot_df * _cdf(-d1)
    return OptionPrice(price=price, option_type=option_type)


def calc_greeks(
    spot: float,
    strike: float,
    time_to_expiry: float,
    volatility: float,
    rate: float,
    dividend_yield: float = 0.0,
    option_type: OptionType = "call",
) -> Greeks:
    """Compute the Black-Scholes-Merton Greeks (delta, gamma, theta, vega, rho) of a European option.

    Theta is per calendar day; vega and rho are per 1.00 change of volatility and rate
    (divide by 100 for a one-point change).

    Args:
        spot: Current price of the underlying asset; must be positive.
        strike: Strike (exercise) price of the option; must be positive.
        time_to_expiry: Time until expiry in years (0.5 = six months); must be positive.
        volatility: Annualised volatility as a decimal (0.2 = 20%); must be positive.
        rate: Continuously compounded risk-free interest rate as a decimal (0.05 = 5%).
        dividend_yield: Continuous dividend yield of the underlying as a decimal (0.02 = 2%).
        option_type: "call" (right to buy) or "put" (right to sell).

    Returns:
        The option's sensitivities to its inputs.
    """
    t, q, r = time_to_expiry, dividend_yield, rate
    d1, d2 = _d1_d2(spot, strike, t, volatility, r, q, option_type)
    spot_df = spot * math.exp(-q * t)
    strike_df = strike * math.exp(-r * t)
    sqrt_t = math.sqrt(t)
    gamma = math.exp(-q * t) * _pdf(d1) / (spot * volatility * sqrt_t)
    vega = spot_df * _pdf(d1) * sqrt_t
    decay = -spot_df * _pdf(d1) * volatility / (2 * sqrt_t)
    if option_type == "call":
        delta = math.exp(-q * t) * _cdf(d1)
        theta = decay - r * strike_df * _cdf(d2) + q * spot_df * _cdf(d1)
        rho = strike * t * math.exp(-r * t) * _cdf(d2)
    else:
        delta = -math.exp(-q * t) * _cdf(-d1)
        theta = decay + r * strike_df * _cdf(-d2) - q * spot_df * _cdf(-d1)
        rho = -strike * t * math.exp(-r * t) * _cdf(-d2)
    return Greeks(delta=delta, gamma=gamma, theta=theta / 365.0, vega=vega, rho=rho)


def _d1_d2(
    spot: float, strike: float, t: float, vol: float, rate: float, dividend_yield: float, option_type: str
) -> tuple[float, float]:
    for name, value in (("spot", spot), ("strike", strike), ("time_to_expiry", t), ("volatility", vol)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value}")
    for name, value in (("rate", rate), ("dividend_yield", dividend_yield)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    if option_type not in ("call", "put"):
        raise ValueError(f"option_type must be 'call' or 'put', got {option_type!r}")
    vol_sqrt_t = vol * math.sqrt(t)
    d1 = (math.log(spot / strike) + (rate - dividend_yield + 0.5 * vol * vol) * t) / vol_sqrt_t
    return d1, d1 - vol_sqrt_t


def _cdf(x: float) -> float:
    """Standard normal cumulative distribution function."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))  # erfc keeps precision far in the tails


def _pdf(x: float) -> float:
    """Standard normal density."""
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
