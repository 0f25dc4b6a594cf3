"""A pytest plugin for tests/mutation/mutation_score.py's coverage map: every test runs under its own coverage
context (its node id), in the pytest process and in the Python subprocesses it starts, and its duration is
written out, so that a mutant of a line is run against exactly the fast tests that execute that line,
fastest first.

Loaded by `coverage run -m pytest -p mutation_map_plugin` with tests/mutation/ on PYTHONPATH; it does
nothing when coverage is not measuring. Not a test module: pytest collects only test_*.py files.
"""

from __future__ import annotations

import base64
import json
import os
from collections import defaultdict

import coverage
import pytest

_durations: dict[str, float] = defaultdict(float)


def _subprocess_config(context: str) -> None:
    """Subprocesses start coverage from the configuration in COVERAGE_PROCESS_CONFIG (coverage's
    `patch = subprocess`); giving it the test's id as static context labels their lines with it."""
    encoded = os.environ.get("COVERAGE_PROCESS_CONFIG")
    if not encoded:
        return
    config = json.loads(base64.b64decode(encoded))
    config["context"] = context
    os.environ["COVERAGE_PROCESS_CONFIG"] = base64.b64encode(json.dumps(config).encode()).decode()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
        _subprocess_config(item.nodeid)
    yield
    if cov is not None:
        cov.switch_context("")
        _subprocess_config("")


def pytest_runtest_logreport(report):
    _durations[report.nodeid] += report.duration


def pytest_sessionfinish(session):
    out = os.environ.get("MUTATION_MAP_DURATIONS")
    if out:
        with open(out, "w") as fh:
            json.dump(_durations, fh)
