"""``python -m coordinator.dashboard [--redis URL] [--host H] [--port P]``."""

from __future__ import annotations

import sys

from .command import main

sys.exit(main())
