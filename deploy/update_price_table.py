"""Regenerate coordinator/core/price_table.json from LiteLLM's price map.

The map is taken from the litellm wheel on PyPI (downloaded with pip, without its
dependencies, and never installed or imported), or from a file you give:

    .venv/bin/python deploy/update_price_table.py                 # latest litellm on PyPI
    .venv/bin/python deploy/update_price_table.py --version 1.110.2
    .venv/bin/python deploy/update_price_table.py --from model_prices.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordinator.core.pricing import (  # noqa: E402 - after the path set-up above
    LITELLM_FILE,
    SNAPSHOT,
    dump_snapshot,
    snapshot_from_litellm,
)


def from_pypi(version: str | None) -> tuple[dict[str, object], str]:
    """LiteLLM's bundled map from its wheel, and the wheel's version."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = f"litellm=={version}" if version else "litellm"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        "--only-binary=:all:", "-q", "-d", tmp, spec], check=True)
        wheel = next(Path(tmp).glob("litellm-*.whl"))
        got = wheel.name.split("-")[1]
        with zipfile.ZipFile(wheel) as z:
            return json.loads(z.read(f"litellm/{LITELLM_FILE}")), got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", help="litellm version to take the map from")
    parser.add_argument("--from", dest="path", help="a local model_prices JSON instead")
    parser.add_argument("--out", default=str(SNAPSHOT), help="where to write the snapshot")
    args = parser.parse_args()
    today = datetime.now(timezone.utc).date().isoformat()
    if args.path:
        prices = json.loads(Path(args.path).read_text(encoding="utf-8"))
        source = f"{Path(args.path).name}, taken {today}"
    else:
        prices, version = from_pypi(args.version)
        source = f"litellm {version} {LITELLM_FILE}, taken {today}"
    snapshot = snapshot_from_litellm(prices, source)
    Path(args.out).write_text(dump_snapshot(snapshot), encoding="utf-8")
    print(f"{len(snapshot['models'])} models from {source} -> {args.out}")


if __name__ == "__main__":
    main()
