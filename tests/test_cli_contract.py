"""The command-line contract as a new user meets it: selections, pipes, signals, options, durations, JSON.

CliRunner checks behaviour; a closed pipe and signals are tried on a real process, and a probe that
must connect talks to the real sshd of tests/sshd.py.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.cli import Duration, main

from .slack import slack

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "inventory.yaml"
DEMO = ROOT / "fleetdiag" / "data" / "demo"
HEALTHY_LOG = (DEMO / "healthy.log").read_text()
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "100"}
ENV.pop("FLEETDIAG_INVENTORY", None)


def cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, list(args), env=env)


def command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from fleetdiag.cli import main; main()", *args]


def healthy_log(tmp_path: Path, name: str = "vllm.log") -> Path:
    log = tmp_path / name
    log.write_text(HEALTHY_LOG)
    return log


# --------------------------------------------------------------------------- 1. empty selections


@pytest.mark.parametrize(
    "argv",
    [
        ["probe", "serving,&training"],
        ["probe", "serving,&training", "--json"],
        ["sweep", "serving,&training", "--json"],
        ["watch", "serving,&training", "--jsonl"],
        ["preflight", "serving,&training", "--json", "--", "vllm", "serve", "m"],
        ["hosts", "serving,&training", "--json"],
    ],
)
def test_empty_selection_is_a_usage_error_naming_the_selector(argv, tmp_path):
    res = cli("-i", str(SHIPPED), *argv, env={"FLEETDIAG_DB": str(tmp_path / "h.db")})
    assert res.exit_code == 2, res.output
    assert "serving,&training" in res.output and "selects no host" in res.output
    assert '"hosts"' not in res.output  # never an empty "all healthy" document


def test_readme_probe_example_runs_against_the_shipped_inventory():
    readme = (ROOT / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("fleetdiag probe '") and "--json" in ln)
    selector = re.search(r"'([^']+)'", line).group(1)
    res = cli("-i", str(SHIPPED), "hosts", selector, "--json")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.output)["hosts"]) >= 2
    # and as written: every selected host gets a record (documentation addresses: unreachable, exit 3)
    res = cli("-i", str(SHIPPED), "probe", selector, "--json", "--connect-timeout", "1", "--deadline", "3")
    assert res.exit_code == 3, res.output
    doc = json.loads(res.output)
    assert [h["host"] for h in doc["hosts"]] == [
        h["host"] for h in json.loads(cli("-i", str(SHIPPED), "hosts", selector, "--json").output)["hosts"]
    ]


def test_a_command_that_loads_the_ssh_library_prints_nothing_on_stderr(tmp_path):
    """The SSH library's import-time notices (cryptography's deprecations of algorithms it supports) never open a
    command's output: a cron sweep mails whatever reaches stderr."""
    log = healthy_log(tmp_path)
    env = {**ENV, "PYTHONWARNINGS": ""}  # Python's own default filters, as a user's shell has them
    for argv in (["analyze", str(log)], ["-i", str(SHIPPED), "check"]):
        code = "import sys; from fleetdiag.cli import main; import asyncssh; sys.argv[0] = 'fleetdiag'; main()"
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == "", proc.stderr


# --------------------------------------------------------------------------- 2. a closed pipe


def closed_pipe_run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader is already gone (`| head -0`, deterministic)."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(
            command(*argv), stdout=w, stderr=subprocess.PIPE, text=True, timeout=timeout, env=ENV, check=False
        )
    finally:
        os.close(w)
    return proc


def test_probe_jsonl_into_a_closed_pipe_ends_quietly(sshd, tmp_path, write_inventory):
    log = healthy_log(tmp_path)
    inv = write_inventory({"a": log, "b": log})
    proc = closed_pipe_run(["-i", str(inv), "probe", "all", "--jsonl", *sshd.cli_args()])
    assert proc.returncode in (0, 141), proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert "BrokenPipe" not in proc.stderr and "Exception ignored" not in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["-i", str(SHIPPED), "hosts"],
        ["-i", str(SHIPPED), "hosts", "--jsonl"],
        ["-i", str(SHIPPED), "hosts", "--json"],
        ["analyze", str(DEMO / "dp_rank.log")],
        ["analyze", str(DEMO / "dp_rank.log"), "--json"],
    ],
)
def test_every_output_into_a_closed_pipe_ends_quietly(argv):
    proc = closed_pipe_run(argv)
    assert proc.returncode in (0, 141), proc.stderr
    assert proc.stderr == "", proc.stderr


# --------------------------------------------------------------------------- 3. signals keep what was found


def black_hole() -> socket.socket:
    """A port that accepts TCP and never speaks SSH: a host that hangs."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


_READERS: dict[int, queue.Queue] = {}


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The child's next stdout line, waiting at most ``timeout`` seconds for it. A thread reads the pipe:
    select() on a buffered pipe misses a line the buffer already holds (two lines in one read), and the
    wait then ran to its end with the line there."""
    lines = _READERS.get(proc.pid)
    if lines is None:
        lines = _READERS[proc.pid] = queue.Queue()

        def pump(out=proc.stdout, q=lines) -> None:
            for line in out:
                q.put(line)
            q.put("")

        threading.Thread(target=pump, daemon=True).start()
    try:
        return lines.get(timeout=max(0.0, timeout))
    except queue.Empty:
        raise AssertionError("no output in time") from None


def read_rest(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """After ``read_line``: the rest of stdout (from its reader thread) and stderr, once the child ends."""
    lines = _READERS.pop(proc.pid)
    proc.wait(timeout)
    err = proc.stderr.read() if proc.stderr is not None else ""
    out = []
    while (line := lines.get(timeout=timeout)) != "":
        out.append(line)
    return "".join(out), err


@pytest.mark.parametrize("fmt", ["--jsonl", "--json"])
def test_ctrl_c_on_probe_keeps_the_hosts_that_answered(sshd, tmp_path, fmt, write_inventory):
    log = healthy_log(tmp_path)
    hole = black_hole()
    try:
        inv = write_inventory({"fast": log, "hung": {"log": log, "port": hole.getsockname()[1]}})
        proc = subprocess.Popen(
            command("-i", str(inv), "probe", "all", fmt, *sshd.cli_args(), "--connect-timeout", "60"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        try:
            if fmt == "--jsonl":
                first = json.loads(read_line(proc, 30))
                assert first["host"] == "fast"
                proc.send_signal(signal.SIGINT)
                out, err = read_rest(proc, 30)
            else:
                time.sleep(6)  # the fast host answers in about a second
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        hole.close()
    assert proc.returncode == 130, err
    if fmt == "--jsonl":
        records = [first] + [json.loads(ln) for ln in out.splitlines()]
    else:
        records = json.loads(out)["hosts"]
    by_host = {r["host"]: r for r in records if "host" in r}  # the last record is the summary event
    assert by_host["fast"]["verdict"] == "healthy"
    assert by_host["hung"]["facts"]["error_kind"] == "interrupted"
    assert "interrupted" in err and "hung" in err


def test_sigterm_on_watch_jsonl_writes_the_summary(sshd, tmp_path, write_inventory):
    log = healthy_log(tmp_path)
    inv = write_inventory({"node": log})
    proc = subprocess.Popen(
        command("-i", str(inv), "watch", "node", "--jsonl", "--no-facts", *sshd.cli_args()),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        first = json.loads(read_line(proc, 30))
        assert first["host"] == "node"
        proc.send_signal(signal.SIGTERM)
        out, err = read_rest(proc, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    last = json.loads(out.splitlines()[-1])
    assert last["event"] == "summary" and last["interrupted"] is True, out + err
    assert [h["host"] for h in last["hosts"]] == ["node"]


# --------------------------------------------------------------------------- 7. options where users put them


def test_global_options_after_the_subcommand():
    res = cli("hosts", "-i", str(SHIPPED), "--no-color", "--redact", "gpu01", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [h["host"] for h in doc["hosts"]] == ["host-1"] or doc["hosts"][0]["host"] != "gpu01"
    res = cli("probe", "-i", str(SHIPPED), "serving,&training")  # -i accepted: the error is the selection's
    assert res.exit_code == 2 and "selects no host" in res.output, res.output
    rules = ROOT / "fleetdiag" / "data" / "rules.yaml"
    res = cli("analyze", str(DEMO / "dp_rank.log"), "--rules", str(rules), "--json")
    assert res.exit_code == 1, res.output


def test_short_k_is_not_identity():
    res = cli("-i", str(SHIPPED), "probe", "gpu01", "-k", "/dev/null")
    assert res.exit_code == 2 and "No such option" in res.output


def test_debug_shows_the_traceback_of_an_internal_error(monkeypatch):
    import fleetdiag.cli.hosts as hosts_mod

    def boom(*_a, **_k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(hosts_mod, "select_hosts", boom)
    plain = cli("-i", str(SHIPPED), "hosts")
    assert plain.exit_code == 4 and "internal error: RuntimeError: a bug" in plain.output
    assert "Traceback" not in plain.output and "--debug" in plain.output
    for argv in (["--debug", "-i", str(SHIPPED), "hosts"], ["-i", str(SHIPPED), "hosts", "--debug"]):
        res = cli(*argv)
        assert res.exit_code == 4 and "Traceback" in res.output and "boom" in res.output, res.output


# --------------------------------------------------------------------------- 8. durations, formats, sources


def test_one_duration_type_everywhere():
    assert Duration().convert("2m", None, None) == 120
    assert Duration().convert("90", None, None) == 90
    assert Duration(unit=86400).convert("90d", None, None) == 90
    assert Duration(unit=86400).convert("12h", None, None) == 0.5
    assert Duration(unit=86400).convert("30", None, None) == 30
    for argv in (
        ["probe", "serving,&training", "--timeout", "2m", "--connect-timeout", "5s", "--deadline", "3m"],
        ["sweep", "serving,&training", "--keep-days", "90d"],
        ["watch", "serving,&training", "--timeout", "2m"],
    ):
        res = cli("-i", str(SHIPPED), *argv)
        assert res.exit_code == 2 and "selects no host" in res.output, (argv, res.output)  # the durations parsed
    res = cli("-i", str(SHIPPED), "probe", "gpu01", "--timeout", "2 parsecs")
    assert res.exit_code == 2 and "--timeout" in res.output
    res = cli("analyze", str(DEMO / "healthy.log"), "--stall-after", "10m", "--json")
    assert res.exit_code == 0, res.output


def test_json_and_jsonl_together_are_refused():
    res = cli("-i", str(SHIPPED), "hosts", "--json", "--jsonl")
    assert res.exit_code == 2 and "exclusive" in res.output


def test_inventory_from_the_environment_is_named_as_such():
    res = cli("hosts", env={"FLEETDIAG_INVENTORY": "/nope"})
    assert res.exit_code == 2
    assert "$FLEETDIAG_INVENTORY" in res.output and "-i" not in res.output


# --------------------------------------------------------------------------- 10. JSON consistency


def test_jsonl_records_carry_the_version_and_hosts_json_uses_host():
    res = cli("-i", str(SHIPPED), "hosts", "--jsonl")
    rows = [json.loads(ln) for ln in res.output.splitlines()]
    assert rows and all(r["version"] == 1 and r["host"] == r["name"] for r in rows)
    doc = json.loads(cli("-i", str(SHIPPED), "hosts", "--json").output)
    assert all("host" in h for h in doc["hosts"])


# --------------------------------------------------------------------------- 6. configuration mistakes


def test_unknown_log_name_is_a_usage_error_for_every_host_at_once(tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        "hosts:\n  a:\n    address: 127.0.0.1\n    logs: {vllm: /x/v.log}\n"
        "  b:\n    address: 127.0.0.1\n    logs: {vllm: /x/v.log}\n  bare:\n    address: 127.0.0.1\n"
    )
    for cmd in (
        ["watch", "a,b", "--log", "vlm", "--duration", "1s"],
        ["probe", "a,b", "--log", "vlm"],
        ["sweep", "a,b", "--log", "vlm"],
    ):
        res = cli("-i", str(inv), *cmd, env={"FLEETDIAG_DB": str(tmp_path / "h.db")})
        assert res.exit_code == 2, res.output
        assert "unknown log 'vlm' for host 'a'" in res.output and "for host 'b'" in res.output
    # a host with no logs is no usage error for watch either: it discovers the log on the host, as probe does
    res = cli("-i", str(inv), "watch", "bare", "--duration", "1s")
    assert res.exit_code != 2 and "no logs configured" not in res.output, res.output


def test_analyze_a_missing_file_is_a_usage_error():
    res = cli("analyze", "/nonexistent.log")
    assert res.exit_code == 2, res.output
    assert "/nonexistent.log" in res.output and "reached the host" not in res.output


def test_check_says_what_each_host_will_read(tmp_path):
    res = cli("-i", str(SHIPPED), "check")
    assert res.exit_code == 0, res.output
    assert re.search(r"uk-node\s+reads vllm: /workspace/dflash/logs/vllm.log", res.output)
    assert re.search(r"gpu03\s+reads train: /data/runs/current/train-\*.log", res.output)
    bad = tmp_path / "inventory.yaml"
    bad.write_text("hosts:\n  a:\n    port: 0\n    gpus: many\n  b:\n    funnel: {stall_after: forever}\n")
    res = cli("-i", str(bad), "check")
    assert res.exit_code == 2
    assert "hosts.a.port" in res.output and "hosts.a.gpus" in res.output and "stall_after" in res.output
    # what probe reads, check accepts (#25): no logs (found on the host), a journal unit, a command's output
    streams = tmp_path / "streams.yaml"
    streams.write_text(
        "hosts:\n  a:\n    address: 127.0.0.1\n"
        "  b:\n    address: 127.0.0.1\n    logs:\n      svc: {journal: vllm.service}\n"
        "  c:\n    address: 127.0.0.1\n    logs:\n      out: {command: 'cat /var/log/train.log'}\n"
    )
    res = cli("-i", str(streams), "check")
    assert res.exit_code == 0, res.output
    assert re.search(r"a\s+reads the log its job writes, found on the host", res.output)
    assert re.search(r"b\s+reads svc: journalctl -u vllm.service", res.output)
    assert re.search(r"c\s+reads out: the output of `cat /var/log/train.log`", res.output)
    assert "ok:" in res.output and "3 hosts, 0 groups" in res.output


def test_sweep_report_dash_writes_the_report_to_stdout(sshd, tmp_path, monkeypatch, write_inventory):
    log = healthy_log(tmp_path)
    inv = write_inventory({"a": log})
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(
        main, ["-i", str(inv), "sweep", "all", "--report", "-", "--db", str(tmp_path / "h.db"), *sshd.cli_args()]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["version"] == 1 and [h["host"] for h in doc["hosts"]] == ["a"]
    assert not (tmp_path / "-").exists()


def test_decisive_time_iso_beside_the_raw_time(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text((DEMO / "dp_rank.log").read_text())
    jan = time.mktime((2026, 1, 3, 12, 0, 0, 0, 0, -1))
    os.utime(log, (jan, jan))  # the May stamp belongs to the year before the file's last write
    res = cli("analyze", str(log), "--json")
    d = json.loads(res.output)["decisive"]
    assert d["time"] == "05-09 15:15:08" and d["time_iso"] == "2025-05-09T15:15:08"


def test_log_time_iso_reads_each_framework_stamp():
    from fleetdiag.timestamps import iso as log_time_iso

    jan2 = time.mktime((2025, 1, 2, 0, 0, 0, 0, 0, -1))
    assert log_time_iso("12-31 23:59:59", jan2) == "2024-12-31T23:59:59"
    assert log_time_iso("626 06:24:44.9", jan2) == "2024-06-26T06:24:44.900"
    assert log_time_iso("05-09 15:15:08", jan2, 3600) == "2024-05-09T15:15:08+01:00"
    assert log_time_iso("2024-11-20 14:37:16", jan2) == "2024-11-20T14:37:16"
    assert log_time_iso("2024-11-20T14:37:16.5Z") == "2024-11-20T14:37:16.500+00:00"
    assert log_time_iso("not a time") is None


def test_demo_serve_try_command_works_and_sigterm_removes_the_temp_dir():
    proc = subprocess.Popen(
        command("demo", "--serve"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, "COLUMNS": "200"},
    )
    try:
        try_line = None
        k = slack()  # the demo runs its probe and two sweeps before it serves: seconds each on a loaded machine
        deadline = time.monotonic() + 120 * k
        while try_line is None and time.monotonic() < deadline:
            line = read_line(proc, deadline - time.monotonic())
            if line.startswith("Try: "):
                try_line = line[len("Try: ") :].strip()
        assert try_line, "no Try: line"
        argv = shlex.split(try_line)
        assert argv[0] == "fleetdiag"
        workdir = Path(argv[argv.index("-i") + 1]).parent
        tried = subprocess.run(
            command(*argv[1:], "--json"), capture_output=True, text=True, timeout=120 * k, env=ENV, check=False
        )
        assert tried.returncode == 1, tried.stderr  # the demo fleet has failures: the command ran, over SSH
        assert {h["host"] for h in json.loads(tried.stdout)["hosts"]} >= {"uk-node", "cn-node"}
        assert workdir.exists()
        proc.send_signal(signal.SIGTERM)
        read_rest(proc, 30 * k)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert not workdir.exists()


# --------------------------------------------------------------------------- 4. tables at pipe widths


@pytest.mark.parametrize("columns", ["80", "60"])
def test_hosts_never_splits_an_address_or_a_path(columns):
    res = cli("-i", str(SHIPPED), "hosts", env={"COLUMNS": columns})
    assert res.exit_code == 0
    lines = res.output.splitlines()
    for whole in (
        "203.0.113.10",
        "198.51.100.20",
        "/workspace/dflash/logs/vllm.log",
        "/data/runs/current/train-*.log",
        "uk-node",
        "cn-node",
        "lab-box",
        "gpu04",
    ):
        assert any(whole in ln for ln in lines), (whole, res.output)
    assert "…" not in res.output


def test_history_at_80_columns_keeps_cause_and_count(sshd, tmp_path, write_inventory):
    log = tmp_path / "vllm.log"
    log.write_text((DEMO / "dp_rank.log").read_text())
    inv = write_inventory({"uk-node": log, "cn-node-with-a-long-name": log})
    db = str(tmp_path / "h.db")
    res = cli("-i", str(inv), "sweep", "all", "--db", db, "--report", str(tmp_path / "r.json"), *sshd.cli_args())
    assert res.exit_code == 1, res.output
    for columns in ("80", "60"):
        res = cli("-i", str(inv), "history", "--db", db, env={"COLUMNS": columns})
        assert res.exit_code == 0, res.output
        assert "AssertionError: DP adjusted local rank 3 is out of bounds" in res.output  # the cause, whole
        assert "cn-node-with-a-long-name" in res.output and "×1" in res.output
        assert "…" not in res.output
