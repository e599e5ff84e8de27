"""``--quick``, every benchmark's short form: the same code paths on tiny sizes, to check
that the script runs (tests/project/test_bench.py runs each so); its figures mean nothing."""

from __future__ import annotations

import argparse
from typing import Any


def parse(ap: argparse.ArgumentParser, **quick: Any) -> argparse.Namespace:
    """``ap``'s arguments plus ``--quick``, which sets each of ``quick``'s arguments."""
    ap.add_argument("--quick", action="store_true",
                    help="a short run that checks the script works (its figures mean nothing)")
    args = ap.parse_args()
    if args.quick:
        for name, value in quick.items():
            setattr(args, name, value)
    return args
