"""Make the risk package (and toolyard, for the chart and the manifest drift test) importable."""

import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1]
REPO = EXAMPLE.parents[1]
sys.path[:0] = [str(EXAMPLE), str(REPO / "worker-image" / "python")]
