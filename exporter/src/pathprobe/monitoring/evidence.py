"""Description fragments that bring the evidence into an alert: whether AWS's own p50 for the
alert's Region pair moved as well (the series `pathprobe aws-performance --serve` imports), and
the record of the test that fired a throughput alert (pathprobe_evidence_last_test_info: its id
at /tests/<id> on the exporter). Each says nothing where its series is absent, so an alert reads
as before on a fleet that imports neither."""

from __future__ import annotations

from .params import Params

AWS_P50 = "pathprobe_aws_latency_p50_seconds"


def aws_moved(p: Params, source: str = "$labels.region", destination: str = "$labels.peer_region") -> str:
    """AWS's p50 of the pair (the template's `source` and `destination` Regions) now and over the RTT
    baseline window, and what the difference means: moved by more than the RTT alerts' least
    increase, AWS's backbone shows it too; else the cause is this fleet's."""
    # Go's explicit argument indexes: the moved query names the pair twice.
    now = f'{AWS_P50}{{scope="region",source_region="%[1]s",destination_region="%[2]s"}}'
    base = f"avg_over_time({now}[{p.rtt_baseline_window}])"
    moved = f"{now} - {base} > {p.rtt_baseline_min_increase_seconds:g}"
    args = f"{source} {destination}"
    return (
        f"{{{{ with printf `{now}` {args} | query }}}} AWS's own p50 for {{{{ {source} }}}} -> "
        f"{{{{ {destination} }}}} (Network Manager's Infrastructure Performance) is "
        "{{ . | first | value | humanizeDuration }}"
        f"{{{{ with printf `{base}` {args} | query }}}} against {{{{ . | first | value | humanizeDuration }}}} "
        f"over {p.rtt_baseline_window}{{{{ end }}}}"
        f"{{{{ with printf `{moved}` {args} | query }}}}: it moved as well, so AWS's backbone shows it "
        "(open an AWS support case with `pathprobe evidence --aws`){{ else }}: it did not move, so the cause "
        "is on this side (the hosts, the VPC, the Transit Gateway){{ end }}.{{ end }}"
    )


def last_test(p: Params) -> str:
    """The id of the last kept record of the alert's test, and where to read it."""
    info = 'pathprobe_evidence_last_test_info{instance="%s",peer="%s",protocol="%s",streams="%s",direction="%s"}'
    args = "$labels.instance $labels.peer $labels.protocol $labels.streams $labels.direction"
    return (
        f"{{{{ with printf `{info}` {args} | query }}}} The last test: "
        '{{ . | first | label "test_id" }} (its whole record: /tests/{{ . | first | label "test_id" }} on '
        "{{ $labels.instance }}).{{ end }}"
    )
