"""Every test session ends with the time each test file took (its tests' set-up, call and
tear-down, module fixtures included; with -n, summed over the workers), so that a CI log says
where its minutes went. Property-based tests have no deadline per example: CI runs the unit tests
at nice 19 beside three labs, where one example can wait a quarter of a second for a CPU, and
Hypothesis would fail the test for it."""

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("pathprobe", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pathprobe")

_seconds_per_file: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds_per_file[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds_per_file:
        return
    terminalreporter.section("time per test file")
    for path, seconds in sorted(_seconds_per_file.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
