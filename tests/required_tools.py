"""Command-line tools some tests need: skipped where absent on a developer's machine, but a
failure in CI (``CI`` set), where every check the README promises must run."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str, checks: str, install: str) -> None:
    """Skip the calling test when ``name`` is not on PATH, or fail it when ``CI`` is set.
    ``checks``: what the test validates with it; ``install``: how to get it."""
    if shutil.which(name) is not None:
        return
    if os.environ.get("CI"):
        pytest.fail(
            f"CI is set but {name} is not on PATH, so {checks} cannot be checked: {install}",
            pytrace=False,
        )
    pytest.skip(f"needs {name} for {checks} ({install}); fails instead when CI is set")
