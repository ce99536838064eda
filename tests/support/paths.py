"""Where the tests find the repository and their own helpers (each path written here once)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO  # what the install puts on sys.path (the checkout: flat layout)
SUPPORT = Path(__file__).resolve().parent  # helper modules the tests name by _target_ (tests.support.NAME)
SCRIPTS = SUPPORT / "scripts"  # users' own scripts and apps the tests run
