"""Every test session ends with the time each test file took (its tests' set-up, call and
tear-down, module fixtures included; with -n, summed over the workers), so that a CI log says
where its minutes went."""

from collections import defaultdict

import pytest

_seconds_per_file: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds_per_file[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds_per_file:
        return
    terminalreporter.section("time per test file")
    for path, seconds in sorted(_seconds_per_file.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
