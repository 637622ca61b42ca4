"""Hangs through the product: probe, analyze and watch judge a quiet log alike (by its own cadence), and a
stalled host gets a second round trip that names where its processes wait.

Real parts only: the real OpenSSH sshd of tests/sshd.py, a real Python process that logs every 0.2 s and then
blocks in ``wait_for_peer`` while its log is silent, and the real py-spy of the test environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fleetdiag.analysis import load_rules
from fleetdiag.cli import main
from fleetdiag.evidence import hang
from fleetdiag.inventory import parse_inventory
from fleetdiag.probe import ProbeSettings, probe_host, spec_for
from fleetdiag.records import HEALTHY, STALLED, HostResult
from fleetdiag.remote import funnel
from fleetdiag.watch import HostWatcher, Watch, WatchSettings

from .test_watch import Run
from .test_watch import settings as watch_settings

RULES = load_rules(user_default=False)
DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo"
VENV_BIN = Path(sys.executable).parent
# what sshd gives a session's PATH (its compiled-in default): the test's py-spy is not on it
SSHD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t % 1 * 1000):03d}"


def _serving_log(path: Path, idle: float) -> Path:
    """The demo's healthy vLLM node (start-up complete, requests served), last written ``idle`` s ago."""
    path.write_bytes((DEMO / "healthy.log").read_bytes())
    t = time.time() - idle
    os.utime(path, (t, t))
    return path


def _training_log(path: Path, idle: float, every: float = 1.0, n: int = 60) -> Path:
    """A training loop that wrote a step every ``every`` s, then fell silent ``idle`` s ago."""
    end = time.time() - idle
    path.write_text(
        "".join(f"{_stamp(end - (n - 1 - i) * every)} INFO train.py:88 step {i} loss 0.{90 - i}\n" for i in range(n))
    )
    os.utime(path, (end, end))
    return path


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["--no-color", *args], env={"COLUMNS": "220", "NO_COLOR": "1"})
    return r.exit_code, r.output


def _probe(sshd: Any, inv: Path, *extra: str) -> tuple[int, str]:
    return _cli(
        "-i",
        str(inv),
        "probe",
        "all",
        *sshd.cli_args(),
        *extra,
    )


def _watcher(log: Path, clock: list[float], **kw: Any) -> HostWatcher:
    """A watch's state machine for one host, fed the probe funnel's snapshot of ``log`` (no SSH needed)."""
    inv = parse_inventory(f"hosts:\n  node:\n    address: 127.0.0.1\n    logs:\n      app: {json.dumps(str(log))}\n")
    settings = WatchSettings(rules=RULES, facts=False, clock=lambda: clock[0], **kw)
    w = HostWatcher(inv.hosts["node"], settings, lambda _w, _prev: None, "test")
    w._snapshot(funnel.run_local(spec_for(str(log), RULES), timeout=30))
    return w


# ------------------------------------------------------------------ probe, analyze and watch agree


def test_idle_serving_node_is_healthy_for_probe_analyze_and_watch(sshd, tmp_path: Path, write_inventory) -> None:
    """A vLLM server that served its last request an hour ago is idle, not stalled: for every command."""
    log = _serving_log(tmp_path / "vllm.log", idle=3600)
    code, out = _cli("analyze", str(log), "--json")
    doc = json.loads(out)
    assert (doc["verdict"], code) == (HEALTHY, 0), doc
    assert doc["facts"]["silence"]["phase"] == "serving" and doc["facts"]["silence"]["silent_s"] >= 3600

    code, out = _probe(sshd, write_inventory({"node": log}), "--json")
    (host,) = json.loads(out)["hosts"]
    assert (host["verdict"], code) == (HEALTHY, 0), host
    assert host["facts"]["silence"]["phase"] == "serving" and host["idle_seconds"] >= 3600
    assert host["timing"]["round_trips"] == 1  # no stall: no second round trip

    clock = [1000.0]
    w = _watcher(log, clock)
    assert w.view.state == HEALTHY, w.view.reason  # the first verdict is probe's
    clock[0] += 6 * 3600  # six more quiet hours
    w.evaluate()
    assert w.view.state == HEALTHY, w.view.reason

    async def go() -> str:  # the real watch over sshd: its first verdict too
        inv = parse_inventory(write_inventory({"node": log}).read_text())
        async with Run(Watch(list(inv.hosts.values()), watch_settings(sshd, stall_after=600.0))) as run:
            await run.state("node", HEALTHY, STALLED)
            await asyncio.sleep(1.0)  # a few heartbeats, each with the log's age
            return run.watch.views["node"].state

    assert asyncio.run(go()) == HEALTHY


def test_training_log_silent_past_its_cadence_is_stalled_for_probe_analyze_and_watch(
    sshd, tmp_path: Path, write_inventory
) -> None:
    """Steps every second, then five minutes of silence: stalled everywhere, with the same reason."""
    log = _training_log(tmp_path / "train.log", idle=300)
    want = "training, it wrote every ~1 s; silent for 5 min (limit 60 s = the 60 s floor)"
    code, out = _cli("analyze", str(log), "--json")
    doc = json.loads(out)
    assert (doc["verdict"], code) == (STALLED, 1), doc
    assert doc["summary"] == want, doc["summary"]
    assert doc["facts"]["silence"]["cadence_s"] == 1.0 and doc["facts"]["silence"]["threshold_s"] == 60.0

    code, out = _probe(sshd, write_inventory({"node": log}), "--json", "--no-stacks")
    (host,) = json.loads(out)["hosts"]
    assert (host["verdict"], code) == (STALLED, 1), host
    assert host["summary"] == want and host["timing"]["round_trips"] == 1  # --no-stacks: one trip

    clock = [1000.0]
    w = _watcher(log, clock)
    assert w.view.state == STALLED and w.view.reason == want, w.view.reason
    assert w.view.to_result().summary == want

    # the same rhythm, silent for 20 s only: within the limit for all of them
    fresh = _training_log(tmp_path / "fresh.log", idle=20)
    assert json.loads(_cli("analyze", str(fresh), "--json")[1])["verdict"] == HEALTHY
    w = _watcher(fresh, clock)
    assert w.view.state == HEALTHY, w.view.reason
    clock[0] += 41  # the silence passes the 60 s limit while watched
    w.evaluate()
    assert w.view.state == STALLED and re.match(
        r"training, it wrote every ~1 s; silent for 6\d s \(limit 60 s", w.view.reason
    ), w.view.reason


def test_starting_log_without_a_cadence_keeps_the_fixed_limit(tmp_path: Path) -> None:
    """No time stamps, still waiting for the server: the host's stall_after decides, in probe and watch."""
    log = tmp_path / "run.log"
    log.write_text("=== Step 1: Launching vLLM server ===\n" + "Waiting for vLLM server to be ready...\n" * 20)
    t = time.time() - 120
    os.utime(log, (t, t))
    fr = funnel.run_local(spec_for(str(log), RULES), timeout=30)
    from fleetdiag.probe import finish

    assert finish("n", fr, RULES, 600.0).verdict != STALLED  # 2 min < 10 min
    res = finish("n", fr, RULES, 90.0)
    assert res.verdict == STALLED and "the fixed 90 s limit" in res.summary and "Waiting for vLLM" in res.summary
    clock = [0.0]
    assert _watcher(log, clock, stall_after=600.0).view.state != STALLED
    w = _watcher(log, clock, stall_after=90.0)
    assert w.view.state == STALLED and w.view.reason == res.summary


# ------------------------------------------------------------------ a real hang, through sshd


# `python hanger.py > train.log`: the job's stdout is its log, as a launcher's redirect makes it
HANGER = """\
import threading, time
def wait_for_peer():
    threading.Event().wait()
for i in range(15):
    t = time.time()
    print(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t % 1 * 1000):03d} INFO step {i}", flush=True)
    time.sleep(0.2)
wait_for_peer()
"""


@pytest.fixture(scope="module")
def hanging_job(tmp_path_factory: pytest.TempPathFactory):
    """A live Python process: a log line every 0.2 s, then blocked in wait_for_peer while its log is silent."""
    tmp = tmp_path_factory.mktemp("hang")
    script, log = tmp / "hanger.py", tmp / "train.log"
    script.write_text(HANGER)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdout=out,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
        )
    try:
        deadline = time.time() + 30
        while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 15):
            time.sleep(0.1)
        assert log.read_text().count("\n") == 15
        # every ~0.2 s: with stall_after 1 s the limit is max(10 × 0.2 s, 1 s) ≈ 2 s; wait well past it
        while time.time() - log.stat().st_mtime < 3.5:
            time.sleep(0.2)
        yield proc, log, tmp
    finally:
        proc.kill()
        proc.wait()


QUICK = {"stall_after": "1s"}  # the host's own limit: a quick stall, for a test of seconds


def _stalled_host(doc: dict, proc: subprocess.Popen) -> dict:
    (host,) = doc["hosts"]
    assert host["verdict"] == STALLED, host
    assert host["summary"].startswith("training, it wrote every ~0.2 s; silent for "), host["summary"]
    assert host["timing"]["round_trips"] == 2
    assert host["facts"]["stacks"]["pids"] == [proc.pid]  # the process that holds the log open: the job
    stack = [e for e in host["evidence"] if e["source"] == "stack"]
    assert len(stack) == 1 and stack[0]["pid"] == proc.pid, host["evidence"]
    assert set(stack[0]) == {"source", "time", "line", "pid", "gpu", "kind", "code"}
    assert stack[0]["line"].startswith(f"rank 0 (pid {proc.pid}) python"), stack[0]
    return host


def test_real_hang_probe_names_the_function_it_waits_in(sshd, hanging_job, write_inventory) -> None:
    proc, log, tmp = hanging_job
    inv = write_inventory({"node": {"log": log, "funnel": QUICK}})
    code, out = _probe(sshd, inv, "--json", "--path-prepend", str(VENV_BIN))  # py-spy lives in the venv
    assert code == 1
    host = _stalled_host(json.loads(out), proc)
    (ev,) = [e for e in host["evidence"] if e["source"] == "stack"]
    assert host["facts"]["stacks"]["pyspy"] == str(VENV_BIN / "py-spy"), host["facts"]["stacks"]
    assert ev["kind"] == "lock" and "wait_for_peer (hanger.py:3)" in ev["line"], ev
    assert "waits: rank 0: waiting on a lock / event (wait_for_peer (hanger.py:3))" in host["summary"]
    assert host["facts"]["stacks"]["notes"] == []
    assert proc.poll() is None  # read-only: py-spy dumped it, it still waits

    code, card = _probe(sshd, inv, "--path-prepend", str(VENV_BIN))
    assert code == 1 and "STALLED" in card and "2 exec round trips" in card
    assert "waits" in card and "wait_for_peer" in card, card
    assert "training, it wrote every ~0.2 s" in card


def test_real_hang_without_pyspy_names_the_proc_fallback(sshd, hanging_job, write_inventory) -> None:
    proc, log, tmp = hanging_job
    assert shutil.which("py-spy", path=SSHD_PATH) is None and not Path("~/.local/bin/py-spy").expanduser().exists()
    inv = write_inventory({"node": {"log": log, "funnel": QUICK}})
    code, out = _probe(sshd, inv, "--json")  # the session's PATH has no py-spy
    host = _stalled_host(json.loads(out), proc)
    (ev,) = [e for e in host["evidence"] if e["source"] == "stack"]
    assert host["facts"]["stacks"]["pyspy"] is None
    assert ev["kind"] == "lock" and "from /proc: main thread S in futex" in ev["line"], ev
    assert any("py-spy is not installed" in n for n in host["facts"]["stacks"]["notes"])

    code, card = _probe(sshd, inv)
    assert code == 1 and "waiting on a lock / event" in card and "from /proc" in card, card
    assert "py-spy is not installed on this host" in card and "wchan and thread states" in card


def test_pyspy_turned_off_by_the_caller_falls_back_the_same(sshd, hanging_job, write_inventory) -> None:
    """py-spy on the host's PATH but turned off (FD_STACKS_PYSPY=none): the /proc view alone, said so."""
    proc, log, tmp = hanging_job
    inv = parse_inventory(write_inventory({"node": {"log": log, "funnel": QUICK}}).read_text())
    settings = ProbeSettings(
        rules=RULES, transport=sshd.opts(), path_prepend=str(VENV_BIN), pyspy="none", save_dir=tmp / "evidence"
    )
    res: HostResult = asyncio.run(probe_host(inv.hosts["node"], settings))
    host = _stalled_host({"hosts": [res.to_json()]}, proc)
    assert host["facts"]["stacks"]["pyspy"] is None and "from /proc" in host["evidence"][-1]["line"]
    saved = (tmp / "evidence" / "node.stacks.txt").read_text()  # --save keeps the second trip's output too
    assert f"@@fd_stacks_proc pid={proc.pid} " in saved and "pyspy=absent" in saved


def test_stacks_command_is_bounded_and_quotes_its_values() -> None:
    cmd = hang.command([12, 34], "/var/log/it's $(here).log", "/opt/x y", dump_timeout=2)
    payload = cmd.rsplit(" ", 1)[1]
    text = __import__("base64").b64decode(payload).decode()
    assert "FD_STACKS_PIDS='12 34'" in text and "FD_STACKS_TIMEOUT=2" in text and "FD_STACKS_MAX=8" in text
    assert "FD_STACKS_LOG='/var/log/it'\"'\"'s $(here).log'" in text and "FD_SPATH='/opt/x y'" in text
    assert hang.job_pids(
        {"serving": {"pid": 7, "writes_log": True}, "gpus": [{"processes": [{"pid": 7}, {"pid": 9}]}]}
    ) == [7, 9]
    assert hang.job_pids({"serving": {"pid": 7, "writes_log": False}}) == []
    found = {"kind": "file", "detail": "/x.log", "found_by": "stdout and stderr of pid 7321 (vllm serve)"}
    assert hang.job_pids({"serving": {"pid": 7321, "writes_log": True}}, found) == [7321]
