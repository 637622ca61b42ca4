"""``sweep --prometheus``: the node_exporter textfile-collector file, read back with Prometheus' own
parser (PyPI ``prometheus-client``) after real sweeps through a real sshd."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from fleetdiag.cli import main
from fleetdiag.prometheus import SweepMetrics, escape_label, render, write_textfile
from fleetdiag.records import HostResult, Timing

from .conftest import inventory_file
from .test_fleet import DP_RANK, HEALTHY_LOG, log, ssh_args


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample by metric name, as Prometheus' parser reads the file (it raises on a bad line)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(got: dict, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels`` (host series also carry category/action)."""
    found = [v for lab, v in got.get(name, []) if all(lab.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, got.get(name))
    return found[0]


def _sweep(tmp_path: Path, sshd, *extra: str, prom: Path | None = None, gpu01: str = DP_RANK):
    inv = inventory_file(
        tmp_path / "inventory.yaml",
        {
            "gpu01": {"log": log(tmp_path, "f", gpu01)},
            "gpu02": {"log": log(tmp_path, "h", HEALTHY_LOG)},
        },
        sshd,
    )
    if prom is None:
        prom = tmp_path / "textfile" / "fleetdiag.prom"
        prom.parent.mkdir(exist_ok=True)
    res = CliRunner().invoke(
        main,
        [
            "-i",
            str(inv),
            *extra,
            "sweep",
            "all",
            "--db",
            str(tmp_path / "h.db"),
            "--report",
            str(tmp_path / "report.json"),
            "--prometheus",
            str(prom),
            *ssh_args(sshd),
        ],
    )
    return res, prom


def test_sweep_writes_a_textfile_prometheus_parses(sshd, tmp_path):
    before = time.time()
    prom_dir = tmp_path / "textfile"
    prom_dir.mkdir(mode=0o755)
    os.chmod(prom_dir, 0o755)
    res, prom = _sweep(tmp_path, sshd)
    assert res.exit_code == 1, res.output
    got = samples(prom.read_text())
    assert value(got, "fleetdiag_host_verdict", host="gpu01", verdict="failed") == 1
    assert value(got, "fleetdiag_host_verdict", host="gpu01", verdict="healthy") == 0
    assert value(got, "fleetdiag_host_verdict", host="gpu02", verdict="healthy") == 1
    assert value(got, "fleetdiag_host_verdict", host="gpu02", verdict="failed") == 0
    assert value(got, "fleetdiag_host_open_incident", host="gpu01") == 1
    assert value(got, "fleetdiag_host_open_incident", host="gpu02") == 0
    assert value(got, "fleetdiag_open_incidents") == 1
    assert value(got, "fleetdiag_history_ok") == 1
    for host in ("gpu01", "gpu02"):
        assert 0 < value(got, "fleetdiag_host_rtt_seconds", host=host) < 5
    assert before <= value(got, "fleetdiag_sweep_last_timestamp_seconds") <= time.time() + 1
    assert 0 <= value(got, "fleetdiag_sweep_duration_seconds") < 120
    assert value(got, "fleetdiag_sweep_hosts", verdict="failed") == 1
    assert value(got, "fleetdiag_sweep_interrupted") == 0
    # every per-host series names its host
    for name in ("fleetdiag_host_verdict", "fleetdiag_host_rtt_seconds", "fleetdiag_host_open_incident"):
        assert all(lab.get("host") in ("gpu01", "gpu02") for lab, _ in got[name])
    # readable by node_exporter's own user; no temp file left for the collector; the directory untouched
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    assert sorted(p.name for p in prom_dir.iterdir()) == ["fleetdiag.prom"]
    assert stat.S_IMODE(prom_dir.stat().st_mode) == 0o755
    assert "Traceback" not in prom.read_text() and "dp_rank" not in prom.read_text().lower()
    # the README's paging rule selects exactly the failed host from this file
    assert paged_hosts(got) == ["gpu01"]


def paged_hosts(got: dict) -> list[str]:
    """Evaluate the README's GPUNodeFailed expression (``name{label="v"} == 1``) over parsed samples."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    rules = yaml.safe_load(re.search(r"```yaml\n(groups:.*?)```", readme, re.DOTALL).group(1))
    expr = next(r["expr"] for g in rules["groups"] for r in g["rules"] if r["alert"] == "GPUNodeFailed")
    m = re.fullmatch(r'(\w+)\{(\w+)="([^"]*)"\} == 1', expr)
    assert m, expr
    name, label, want = m.groups()
    return sorted(lab["host"] for lab, v in got[name] if lab.get(label) == want and v == 1)


def test_the_next_sweep_replaces_the_file_and_resolves_the_alert(sshd, tmp_path):
    res, prom = _sweep(tmp_path, sshd)
    assert res.exit_code == 1, res.output
    first = prom.stat().st_ino
    res, prom = _sweep(tmp_path, sshd, gpu01=HEALTHY_LOG)  # gpu01 recovers
    assert res.exit_code == 0, res.output
    got = samples(prom.read_text())
    assert prom.stat().st_ino != first  # a new file renamed over the old one, never rewritten in place
    assert value(got, "fleetdiag_host_verdict", host="gpu01", verdict="failed") == 0
    assert value(got, "fleetdiag_host_verdict", host="gpu01", verdict="healthy") == 1
    assert value(got, "fleetdiag_open_incidents") == 0


def test_redact_hides_host_names_in_the_metrics(sshd, tmp_path):
    res, prom = _sweep(tmp_path, sshd, "--redact")
    assert res.exit_code == 1, res.output
    text = prom.read_text()
    assert "gpu01" not in text and "gpu02" not in text and "127.0.0.1" not in text
    got = samples(text)
    hosts = {lab["host"] for lab, _ in got["fleetdiag_host_verdict"]}
    assert len(hosts) == 2
    # the same placeholders as the redacted JSON report, so the two can be read side by side
    report = json.loads((tmp_path / "report.json").read_text())
    assert hosts == {h["host"] for h in report["hosts"]}
    failed = [lab["host"] for lab, v in got["fleetdiag_host_verdict"] if lab["verdict"] == "failed" and v == 1]
    assert failed == [h["host"] for h in report["hosts"] if h["verdict"] == "failed"]


def test_an_unwritable_metrics_file_is_a_warning_and_the_report_is_kept(sshd, tmp_path):
    res, _ = _sweep(tmp_path, sshd, prom=tmp_path / "textfile" / "missing-dir" / "fleetdiag.prom")
    assert res.exit_code == 1, res.output  # the hosts' verdict, not an internal error
    assert "cannot write the metrics file" in res.stderr
    assert json.loads((tmp_path / "report.json").read_text())["hosts"][0]["verdict"] == "failed"


HOSTILE = ['gpu"01', "back\\slash\\", "new\nline", 'all"three\\\n} 1\nfake_metric 9']


def test_hostile_host_names_and_verdicts_are_escaped():
    results = [HostResult(host=h, verdict="failed", timing=Timing(rtt_ms=2.5)) for h in HOSTILE]
    results.append(HostResult(host="gpu09", verdict='we"ird\\verdict\n} 7'))
    text = render(SweepMetrics(results, 100.0, 102.5, open_incidents={HOSTILE[0]: object()}))
    got = samples(text)
    assert "fake_metric" not in got
    for h in HOSTILE:
        assert value(got, "fleetdiag_host_verdict", host=h, verdict="failed") == 1
        assert value(got, "fleetdiag_host_rtt_seconds", host=h) == 0.0025
    assert value(got, "fleetdiag_host_verdict", host="gpu09", verdict='we"ird\\verdict\n} 7') == 1
    assert value(got, "fleetdiag_host_open_incident", host=HOSTILE[0]) == 1
    assert value(got, "fleetdiag_sweep_duration_seconds") == 2.5
    # one sample per line: no raw newline escapes a label value
    assert all(ln.startswith(("#", "fleetdiag_")) for ln in text.splitlines())


def test_escape_label_follows_the_exposition_format():
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_write_textfile_is_atomic_and_leaves_no_temp(tmp_path):
    target = tmp_path / "x.prom"
    target.write_text("old 1\n")
    write_textfile(target, "new 2\n")
    assert target.read_text() == "new 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.prom"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
