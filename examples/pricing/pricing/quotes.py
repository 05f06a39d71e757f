"""Quote lookup from the `quotes.csv` file shipped with the package (illustrative data).

Two tools over the same data show the two execution styles:
`get_quote` reads the file once per process and keeps it (Pool mode with process
reuse: later calls are served from memory); `get_quote_fresh` reads it on every call
(Job mode: every call is a new process anyway).
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Quote:
    """Latest quote of one instrument.

    Attributes:
        symbol: Ticker symbol, upper case.
        bid: Best bid price.
        ask: Best ask price.
        last: Last traded price.
        currency: ISO 4217 currency code of the prices.
    """

    symbol: str
    bid: float
    ask: float
    last: float
    currency: str


def get_quote(symbol: str) -> Quote:
    """Look up the latest bid, ask and last price of an instrument by ticker symbol.

    The quote table is loaded once per worker process and then served from memory.

    Args:
        symbol: Ticker symbol, for example "AAPL" (case-insensitive).
    """
    return _find(_cached_quotes(), symbol)


def get_quote_fresh(symbol: str) -> Quote:
    """Look up the latest bid, ask and last price of an instrument, re-reading the quote file.

    Same answer as get_quote, but the quote table is read from disk on every call.

    Args:
        symbol: Ticker symbol, for example "AAPL" (case-insensitive).
    """
    return _find(load_quotes(), symbol)


def load_quotes() -> dict[str, Quote]:
    """Read `quotes.csv` into quotes keyed by upper-case symbol."""
    text = resources.files(__package__).joinpath("quotes.csv").read_text(encoding="utf-8")
    quotes = {}
    for row in csv.DictReader(io.StringIO(text)):
        symbol = row["symbol"].strip().upper()
        quotes[symbol] = Quote(
            symbol=symbol,
            bid=float(row["bid"]),
            ask=float(row["ask"]),
            last=float(row["last"]),
            currency=row["currency"].strip(),
        )
    return quotes


@functools.cache
def _cached_quotes() -> dict[str, Quote]:
    return load_quotes()


def _find(quotes: dict[str, Quote], symbol: str) -> Quote:
    try:
        return quotes[symbol.strip().upper()]
    except KeyError:
        raise LookupError(f"unknown symbol {symbol!r}; known: {', '.join(sorted(quotes))}") from None
