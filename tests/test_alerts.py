"""docs/prometheus/alerts.yaml: valid for Prometheus (``promtool check rules``), and firing, with the
``category``/``action`` labels routing needs, on the series a real sweep writes (``promtool test rules``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from fleetdiag.prometheus import SweepMetrics, render
from fleetdiag.records import DEGRADED, HostResult, JobRole, Timing

from .test_prometheus import _sweep, samples

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "docs" / "prometheus" / "alerts.yaml"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_promtool_accepts_the_shipped_rules_and_the_textfile(sshd, tmp_path):
    res = promtool("check", "rules", str(ALERTS))
    assert res.returncode == 0 and "SUCCESS" in res.stdout + res.stderr, res.stdout + res.stderr
    out, prom = _sweep(tmp_path, sshd)
    assert out.exit_code == 1, out.output
    check = subprocess.run(["promtool", "check", "metrics"], input=prom.read_text(), capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # lint: names, HELP/TYPE, label syntax


def _series(text: str) -> list[dict[str, str]]:
    """The textfile's samples as promtool input series, each value held for 30 minutes."""
    out = []
    for name, rows in samples(text).items():
        for labels, v in rows:
            inner = ",".join(f'{k}="{val}"' for k, val in sorted(labels.items()))
            out.append({"series": f"{name}{{{inner}}}", "values": f"{v:g}x30"})
    return out


def test_alerts_fire_on_a_real_sweep_with_the_routing_labels(sshd, tmp_path):
    """gpu01's DP-rank assertion is a config error: FleetdiagHostFailed fires with category/action config;
    nothing pages the datacenter. A degraded GPU (the same file format) fires FleetdiagHardwareAction; a host
    that failed only as its job's consequence pages nobody."""
    out, prom = _sweep(tmp_path, sshd)
    assert out.exit_code == 1, out.output
    real = _series(prom.read_text())
    failed = [s for s in real if 'host="gpu01"' in s["series"] and 'verdict="failed"' in s["series"]]
    assert failed and 'action="config"' in failed[0]["series"] and 'category="config"' in failed[0]["series"]
    bad_gpu = HostResult(host="gpu09", verdict=DEGRADED, timing=Timing(rtt_ms=1.0))
    victim = HostResult(host="gpu10", verdict="failed", job_role=JobRole("consequence", root="gpu11"))
    degraded = _series(render(SweepMetrics(results=[bad_gpu, victim], started=0.0, finished=1.0)))
    base = {"host": "gpu01", "verdict": "failed", "category": "config", "action": "config"}
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": real,
                "alert_rule_test": [
                    {
                        "eval_time": "5m",
                        "alertname": "FleetdiagHostFailed",
                        "exp_alerts": [
                            {
                                "exp_labels": {**base, "severity": "critical"},
                                "exp_annotations": {
                                    "summary": "gpu01: the job failed (config, action config)",
                                    "description": "Run `fleetdiag probe gpu01` for the decisive error and its hint.",
                                },
                            }
                        ],
                    },
                    {"eval_time": "5m", "alertname": "FleetdiagHardwareAction", "exp_alerts": []},
                    {"eval_time": "5m", "alertname": "FleetdiagHostStalled", "exp_alerts": []},
                ],
            },
            {
                "interval": "1m",
                "input_series": degraded,
                "alert_rule_test": [
                    {
                        "eval_time": "5m",
                        "alertname": "FleetdiagHardwareAction",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "host": "gpu09",
                                    "category": "hardware",
                                    "action": "hardware",
                                    "severity": "critical",
                                    "team": "datacenter",
                                },
                                "exp_annotations": {
                                    "summary": "gpu09: a hardware fault; drain, reset or reboot the node"
                                },
                            }
                        ],
                    },
                    {"eval_time": "5m", "alertname": "FleetdiagHostFailed", "exp_alerts": []},  # gpu10: a victim
                ],
            },
        ],
    }
    spec = tmp_path / "alerts_test.yaml"
    spec.write_text(yaml.safe_dump(tests, sort_keys=False))
    res = promtool("test", "rules", str(spec))
    assert res.returncode == 0, res.stdout + res.stderr
    # and the test can fail: the same spec against rules that ignore the action label does not pass
    broken = tmp_path / "broken.yaml"
    broken.write_text(ALERTS.read_text().replace('action=~"hardware|driver"', 'action=~"nothing"'))
    tests["rule_files"] = [str(broken)]
    spec.write_text(yaml.safe_dump(tests, sort_keys=False))
    assert promtool("test", "rules", str(spec)).returncode != 0
