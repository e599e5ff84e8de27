"""``python -m coordinator.cli``: the same as ``budgetctl``."""

from __future__ import annotations

import sys

from . import main

sys.exit(main())
