"""A ``command:`` log source through the CLI over a real sshd (#25 item 3).

A finished command's output is the log, read once: ``watch`` does not run it again (``cat train.log``
twice read the log twice and said ``recovered`` 0.6 s after ``failed``). A command that does not end
is cut on the host inside the exec's own timeout, and that is the host's status: never ``healthy``
with no lines, never ``connecting`` for ever.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from fleetdiag.cli import main
from fleetdiag.exitcodes import Exit

SEED = (Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo" / "dp_rank.log").read_text()
DECISIVE = "DP adjusted local rank 3 is out of bounds"


def _inventory(write_inventory, tmp: Path) -> Path:
    log = tmp / "train.log"
    log.write_text(SEED)
    q = "'" + str(log).replace("'", "'\\''") + "'"
    # the endless one's passes get 2 s on the host (funnel.timeout), well inside the exec's own timeout
    return write_inventory(
        {
            "done": {"logs": {"app": {"command": f"cat {q}"}}},
            "endless": {"logs": {"app": {"command": "echo loading; exec sleep 600"}}, "funnel": {"timeout": 2}},
        }
    )


def test_probe_reads_a_finished_command_and_names_one_that_does_not_end(sshd, tmp_path: Path, write_inventory) -> None:
    inv = _inventory(write_inventory, tmp_path)
    r = CliRunner().invoke(main, ["-i", str(inv), "probe", "all", "--json", *sshd.cli_args()])
    hosts = {h["host"]: h for h in json.loads(r.output)["hosts"]}
    assert hosts["done"]["verdict"] == "failed" and DECISIVE in hosts["done"]["decisive"]["line"]
    endless = hosts["endless"]
    assert endless["verdict"] == "no-log", endless  # not healthy "no log lines to analyse"
    assert "did not end within 2s" in endless["error"] and "read once" in endless["error"], endless
    assert r.exit_code == Exit.FAILED


def test_watch_reads_a_finished_command_once_and_a_cut_one_is_no_log(sshd, tmp_path: Path, write_inventory) -> None:
    inv = _inventory(write_inventory, tmp_path)
    r = CliRunner().invoke(
        main,
        ["-i", str(inv), "watch", "all", "--jsonl", "--duration", "10", "--heartbeat", "0.5s"] + sshd.cli_args(),
    )
    docs = [json.loads(ln) for ln in r.output.splitlines() if ln.startswith("{")]
    states = [(d["host"], d["state"]) for d in docs if d.get("event") == "state"]
    done = [s for h, s in states if h == "done"]
    assert done == ["failed"], states  # once: no "recovered" from a second run of `cat`
    endless = [s for h, s in states if h == "endless"]
    assert endless and endless[-1] == "no-log", states
    summary = next(d for d in docs if d.get("event") == "summary")
    by = {h["host"]: h for h in summary["hosts"]}
    assert DECISIVE in by["done"]["decisive"]["line"]
    assert "did not end within 2s" in by["endless"]["error"], by["endless"]
    assert r.exit_code == Exit.FAILED
