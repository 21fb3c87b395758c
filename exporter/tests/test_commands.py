"""The command line: bad values are exit 2 with the option named, defaults come from the models."""

import subprocess
import sys

import pytest

from pathprobe.commands import build_parser
from pathprobe.commands.common import detector
from pathprobe.config import Responders
from pathprobe.probe_settings import EchoSettings, RttSettings, SteadyStateSettings
from pathprobe.strict import default


def test_a_bad_probe_setting_names_the_option_and_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pathprobe", "probe", "loss", "127.0.0.1", "--flows", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--flows: Input should be greater than or equal to 1" in proc.stderr and "Traceback" not in proc.stderr


def test_the_cli_defaults_are_the_config_models() -> None:
    parser = build_parser()
    rtt = parser.parse_args(["probe", "rtt", "127.0.0.1"])
    assert (rtt.interval, rtt.size, rtt.timeout, rtt.flows, rtt.port) == (
        default(RttSettings, "interval_seconds"),
        default(RttSettings, "size_bytes"),
        default(RttSettings, "timeout_seconds"),
        default(RttSettings, "flows"),
        default(Responders, "rr_port"),
    )
    loss = parser.parse_args(["probe", "loss", "127.0.0.1"])
    assert (loss.size, loss.flows) == (default(EchoSettings, "size_bytes"), default(EchoSettings, "flows"))
    serve = parser.parse_args(["serve"])
    assert serve.rr_max_connections_per_source == default(Responders, "rr_max_connections_per_source")


@pytest.mark.parametrize("verb", [["probe", "throughput", "127.0.0.1"], ["capacity", "127.0.0.1"]])
def test_tcp_tests_stop_at_their_steady_state_unless_asked_for_fixed_length(verb: list[str]) -> None:
    parser = build_parser()
    assert default(SteadyStateSettings, "enabled") is True
    assert detector(parser.parse_args(verb)) is not None
    assert detector(parser.parse_args([*verb, "--steady-state"])) is not None
    assert detector(parser.parse_args([*verb, "--fixed-length"])) is None
    with pytest.raises(SystemExit):  # one or the other
        parser.parse_args([*verb, "--steady-state", "--fixed-length"])
    # `plan` follows the config unless told.
    assert parser.parse_args(["plan", "--config", "c"]).steady_state is None


def test_a_prometheus_config_missing_what_its_layout_needs_is_exit_2() -> None:
    base = [sys.executable, "-m", "pathprobe", "alerts", "prometheus-config", "--layout", "regional"]
    proc = subprocess.run([*base, "--file-sd", "t.json"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "remote_write_url" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [*base, "--remote-write-url", "http://g/api/v1/write"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2 and "file_sd" in proc.stderr
    bad_json = [*base, "--file-sd", "t.json", "--remote-write-url", "http://g", "--scrape-json", "{"]
    proc = subprocess.run(bad_json, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--scrape-json: Expecting" in proc.stderr
