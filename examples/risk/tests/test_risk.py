"""Risk example: historical VaR, stress scenarios, the P&L chart, and manifest drift."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from risk import data
from risk.stress import stress_test
from risk.var import historical_var

EXAMPLE = Path(__file__).resolve().parents[1]
REPO = EXAMPLE.parents[1]
BOOK = {"us_equity": 1_000_000.0, "us_treasury_10y": 500_000.0}


def test_single_factor_var_is_the_loss_quantile_of_that_factor():
    returns = sorted(-data.returns()["us_equity"].to_numpy() * 2_000_000)
    # The 99% quantile of 504 losses, interpolated between the 498th and 499th smallest.
    position = 0.99 * (len(returns) - 1)
    low = returns[math.floor(position)]
    expected = low + (returns[math.floor(position) + 1] - low) * (position - math.floor(position))
    result = historical_var({"us_equity": 2_000_000})
    assert result["var"] == pytest.approx(expected, rel=1e-12)
    assert result["observations"] == 504
    worst = data.returns()["us_equity"].idxmin()
    assert result["worst_day"] == {"date": worst, "pnl": pytest.approx(data.returns()["us_equity"][worst] * 2_000_000)}


def test_var_grows_with_confidence_scales_with_size_and_root_time():
    base = historical_var(BOOK)
    assert historical_var(BOOK, confidence=0.95)["var"] < base["var"] <= base["expected_shortfall"]
    doubled = historical_var({k: 2 * v for k, v in BOOK.items()})
    assert doubled["var"] == pytest.approx(2 * base["var"])
    assert historical_var(BOOK, horizon_days=10)["var"] == pytest.approx(base["var"] * math.sqrt(10))


def test_diversification_lowers_var():
    alone = historical_var({"us_equity": 1_000_000})["var"] + historical_var({"us_treasury_10y": 500_000})["var"]
    assert historical_var(BOOK)["var"] < alone


def test_stress_pnl_is_position_times_shock_worst_first():
    result = stress_test(BOOK)
    by_name = {r["scenario"]: r["pnl"] for r in result["results"]}
    assert by_name["equity_crash"] == pytest.approx(1_000_000 * -0.25 + 500_000 * 0.04)
    assert by_name["rates_up"] == pytest.approx(1_000_000 * -0.08 + 500_000 * -0.12)
    pnls = [r["pnl"] for r in result["results"]]
    assert pnls == sorted(pnls) and result["worst"] == result["results"][0]["scenario"] == "liquidity_shock"
    only = stress_test(BOOK, scenarios=["dollar_rally"])
    assert [r["scenario"] for r in only["results"]] == ["dollar_rally"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: historical_var({"gold": 1.0}), "unknown risk factor(s) gold; known: us_equity, eu_equity"),
        (lambda: historical_var({}), "positions is empty"),
        (lambda: historical_var({"us_equity": float("nan")}), "must be a finite number"),
        (lambda: historical_var(BOOK, confidence=1.0), "confidence must be between 0.5 and 0.999"),
        (lambda: historical_var(BOOK, horizon_days=0), "horizon_days must be between 1 and 250"),
        (lambda: stress_test(BOOK, scenarios=["meteor"]), "unknown scenario(s) meteor; known: equity_crash"),
        (lambda: stress_test(BOOK, scenarios=[]), "unknown scenario(s) (none given)"),
    ],
)
def test_bad_input_is_refused_naming_what_is_known(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_the_chart_tool_returns_a_png_through_the_runner_protocol(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": f"{EXAMPLE}{os.pathsep}{REPO / 'worker-image' / 'python'}",
        "TOOLYARD_RESULT_FILE": str(tmp_path / "result.json"),
        "TOOLYARD_ERROR_FILE": str(tmp_path / "error.txt"),
        "TOOLYARD_OUTPUT_DIR": str(tmp_path / "out"),
        "MPLCONFIGDIR": str(tmp_path / "mpl"),
    }
    (tmp_path / "out").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "toolyard.run", "risk.chart:pnl_chart"],
        input=json.dumps({"positions": BOOK}), capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr + (tmp_path / "error.txt").read_text(errors="replace")
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["image"] == "pnl.png"
    assert result["var"] == pytest.approx(historical_var(BOOK)["var"])
    manifest = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert [(m["name"], m["mimeType"], m["image"]) for m in manifest] == [("pnl.png", "image/png", True)]
    assert (tmp_path / "out" / "files" / "pnl.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_tools_yaml_matches_the_code(tmp_path):
    regenerated = tmp_path / "tools.yaml"
    proc = subprocess.run(
        ["bash", str(EXAMPLE / "generate.sh"), str(regenerated)],
        capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr
    assert regenerated.read_text() == (EXAMPLE / "tools.yaml").read_text(), (
        "examples/risk/tools.yaml is stale: run examples/risk/generate.sh"
    )


def test_the_tests_pin_the_versions_the_image_installs():
    def pins(path: Path) -> dict[str, str]:
        lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
        return dict(line.split("==") for line in lines if "==" in line)

    image = pins(EXAMPLE / "requirements.txt")
    tests = pins(REPO / "tests" / "python-requirements.txt")
    assert image and {name: tests.get(name) for name in image} == image
