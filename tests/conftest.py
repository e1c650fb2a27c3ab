"""Shared fixtures: tiny random models, an isolated specrt cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def real_cache() -> Path:
    """The cache that holds the real default model (shared across tests and runs)."""
    return Path(os.environ.get("SPECRT_CACHE") or Path.home() / ".cache" / "specrt")
