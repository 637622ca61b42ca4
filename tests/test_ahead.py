"""Send-ahead (fleetdiag/ssh/keeper/ahead.py): a warm ``probe HOST`` sends its request before the CLI's
heavy imports, and prints exactly what the CLI alone prints. Through the console entry over a real sshd."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fleetdiag.ssh.keeper import client as keeper_client
from fleetdiag.ssh.keeper import connect_params, connection_key, wire

from .cli_env import cli_env
from .procs import pids_with

REPO = Path(__file__).resolve().parent.parent
SEED = (REPO / "fleetdiag" / "data" / "demo" / "dp_rank.log").read_text()
DECISIVE = "AssertionError: DP adjusted local rank 3 is out of bounds"

# The console entry in this process, noting for each run request written to a Unix socket whether the CLI
# (click, rich, the analysis) was imported by then; the notes go to stderr after the output.
ENTRY = r"""
import base64, os, re, socket, sys
HEAVY = ("click", "rich", "fleetdiag.cli", "fleetdiag.analysis", "fleetdiag.inventory", "asyncio")
notes = []
marks = []
def note(sock, data):
    if sock.family == socket.AF_UNIX and b'"op": "run"' in bytes(data[:4096]):
        notes.append(sorted(m for m in HEAVY if m in sys.modules))
        b64 = re.search(rb"[A-Za-z0-9+/]{400,}", bytes(data))  # the script's start, base64 (the marker is on line 1)
        script = base64.b64decode(b64.group()[:400]) if b64 else b""
        marks.append(sorted(set(re.findall(rb"@@FD:[0-9a-f]+", script))))
for name in ("send", "sendall"):
    def wrapped(self, data, *a, _real=getattr(socket.socket, name)):
        note(self, data)
        return _real(self, data, *a)
    setattr(socket.socket, name, wrapped)
_exit = os._exit
def exit_saying(code):
    sys.stderr.write("AHEAD-NOTES " + repr(notes) + "\n")
    sys.stderr.write("AHEAD-MARKS " + repr(marks) + "\n")
    sys.stderr.flush()
    _exit(code)
os._exit = exit_saying
if os.environ.get("AHEAD_TEST_DIES"):  # a CLI killed right after its request left
    from fleetdiag.ssh.keeper import ahead
    ahead.send_early(sys.argv)
    exit_saying(9)
if os.environ.get("AHEAD_TEST_KILLS"):  # the keeper killed right after the request left: then the CLI
    import signal, time
    from fleetdiag.ssh.keeper import ahead
    assert ahead.send_early(sys.argv)
    pid = int(os.environ["AHEAD_TEST_KILLS"])
    os.kill(pid, signal.SIGKILL)
    while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    from fleetdiag.cli import run
    run()
from fleetdiag.entry import run
run()
"""


def marks_sent(p: subprocess.CompletedProcess) -> list:
    """The end markers in each run request the CLI wrote, in order (from ENTRY's notes)."""
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("AHEAD-MARKS "))
    return eval(line.split(" ", 1)[1])


def cli(rt: Path, inv: Path, sshd, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, list]:
    argv = [sys.executable, "-c", ENTRY, "-i", str(inv), "probe", "uk-node", *args, *sshd.cli_args()]
    full = cli_env(rt, COLUMNS="160", **(env or {}))
    p = subprocess.run(argv, capture_output=True, text=True, timeout=150, env=full, cwd=rt.parent)
    line = next((ln for ln in p.stderr.splitlines() if ln.startswith("AHEAD-NOTES ")), None)
    assert line is not None, p.stderr
    return p, eval(line.split(" ", 1)[1])  # a list of lists of module names, printed by ENTRY


def comparable(doc: dict) -> dict:
    """A probe's JSON less what differs between any two runs (its timings, the host clock's sample)."""
    for h in doc["hosts"]:
        h.pop("timing", None)
        h.pop("idle_seconds", None)  # the log's age at the moment of each probe
        ((h.get("facts") or {}).get("kernel_log") or {}).pop("boot", None)  # the host's now less its uptime
        for k in ("clock", "received"):
            (h.get("facts") or {}).pop(k, None)
    return doc


def card_text(card: str) -> str:
    """A card less its two time-dependent lines' numbers (the log's age, the probe's timings)."""
    return "\n".join(
        re.sub(r"[\d.]+ *", "#", ln).rstrip(" │") if re.match(r"│ (log age|found with) ", ln) else ln
        for ln in card.splitlines()
    )


def flat(value, path: str = "") -> dict:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{path}.{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{path}[{i}]").items()}
    return {path: value}


def differ(a: dict, b: dict) -> list:
    fa, fb = flat(a), flat(b)
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def uses(rt: Path) -> int:
    kept = keeper_client.list_kept(rt) or []
    return sum(c["uses"] for c in kept)


def test_warm_probe_sends_ahead_and_prints_what_the_cli_alone_prints(sshd, rt, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))  # the CLIs' ~/.config: this test's own
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    rules = tmp_path / "rules.yaml"
    rules.write_text("keywords: []\n")
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        json.dumps(
            {
                "hosts": {
                    "uk-node": {"address": "127.0.0.1", "port": sshd.port, "user": sshd.user, "logs": {"app": str(log)}}
                }
            }
        )
    )
    base = ["--persist", "5m"]
    try:
        # 1. cold: starts the keeper, sends its own request (after the imports), remembers it
        p, notes = cli(rt, inv, sshd, "--json", *base)
        assert p.returncode == 1 and DECISIVE in p.stdout, p.stderr
        assert len(notes) == 1 and "asyncio" in notes[0]
        (entry,) = (rt / "ahead").glob("*.json")
        assert (os.stat(entry).st_mode & 0o077) == 0 and (os.stat(rt / "ahead").st_mode & 0o077) == 0
        # what CLIs killed between claiming an entry and dropping it, or while writing one, leave behind (the
        # window is a rename or a write: made here); a live process's claim stays
        dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()
        left = [rt / "ahead" / f".claim.{dead}.{'0' * 32}", rt / "ahead" / f".{'1' * 32}.{dead}"]
        live = rt / "ahead" / f".claim.{os.getpid()}.{'2' * 32}"
        for f in (*left, live):
            f.write_text("{}")
        # the user's rules file (~/.config/fleetdiag/rules.yaml) written after the keeper started and the request
        # was remembered: the early request still goes (the command is the same), and the answer is judged with
        # the user's signature, not a set compiled before it appeared
        (tmp_path / "cfg" / "fleetdiag").mkdir(parents=True)
        (tmp_path / "cfg" / "fleetdiag" / "rules.yaml").write_text(
            "signatures:\n  - name: user-dp-rank\n    pattern: 'DP adjusted local rank'\n    category: disk\n"
        )
        # 2. warm: one run request, and it left before click, rich, the analysis or asyncio were imported
        n0 = uses(rt)
        p, notes = cli(rt, inv, sshd, "--json", *base)
        assert p.returncode == 1, p.stderr
        assert notes == [[]], notes
        decisive = json.loads(p.stdout)["hosts"][0]["decisive"]
        assert (decisive["rule"], decisive["category"]) == ("user-dp-rank", "disk"), decisive
        assert not any(f.exists() for f in left) and live.exists(), "a dead CLI's claimed entry was not reaped"
        live.unlink()
        assert uses(rt) == n0 + 1, "the early request was the probe's: the host ran one command"
        ahead = comparable(json.loads(p.stdout))
        # 3. the same, not sent ahead: the same document
        p, notes = cli(rt, inv, sshd, "--json", *base, env={"FLEETDIAG_AHEAD": "0"})
        assert notes and notes[0] and "click" in notes[0]
        assert not differ(comparable(json.loads(p.stdout)), ahead)
        assert DECISIVE in ahead["hosts"][0]["decisive"]["line"]
        # the card, byte for byte (two runs each: the first of each argv only remembers)
        cards = []
        for env in ({}, {}, {"FLEETDIAG_AHEAD": "0"}):
            p, notes = cli(rt, inv, sshd, *base, env=env)
            cards.append((p.returncode, p.stdout, notes))
        assert cards[1][2] == [[]], "the second card run sent ahead"
        assert card_text(cards[1][1]) == card_text(cards[2][1]) and cards[1][0] == cards[2][0] == 1
        assert DECISIVE in cards[1][1]
        # 4. a rules file edited in place changes the command but not the command line: the early request
        # goes, differs from the CLI's own, is dropped; the answer is the new command's
        rules.write_text("keywords: ['DP adjusted local rank']\n")
        p, notes = cli(rt, inv, sshd, "--json", "--rules", str(rules), *base)  # remembers with these rules
        rules.write_text("keywords: ['nothing matches this']\n")
        p, notes = cli(rt, inv, sshd, "--json", "--rules", str(rules), *base)
        assert len(notes) == 2 and notes[0] == [] and "click" in notes[1], notes
        mismatched = comparable(json.loads(p.stdout))
        p, _ = cli(rt, inv, sshd, "--json", "--rules", str(rules), *base, env={"FLEETDIAG_AHEAD": "0"})
        assert not differ(comparable(json.loads(p.stdout)), mismatched)
        # 5. an edited inventory: nothing is sent ahead (its file's state is part of what was remembered)
        inv.write_text(inv.read_text() + "\n")
        p, notes = cli(rt, inv, sshd, "--json", *base)
        assert len(notes) == 1 and "click" in notes[0] and p.returncode == 1
        # 6. a remembered marker goes out once: two CLIs at once, then one killed after its request left,
        # never send the same one (the host saw it in the first command, its log could print it)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pair = list(pool.map(lambda _: cli(rt, inv, sshd, "--json", *base), range(2)))
        assert [q.returncode for q, _ in pair] == [1, 1], [q.stderr for q, _ in pair]
        firsts = [marks_sent(q)[0] for q, _ in pair]
        assert all(len(m) == 1 for m in firsts) and firsts[0] != firsts[1], firsts
        assert sorted(len(n) for _, n in pair) == [1, 1] and sorted(n[0] == [] for _, n in pair) == [False, True]
        entry = max((rt / "ahead").glob("*.json"), key=lambda f: f.stat().st_mtime_ns)  # this command line's
        dying = json.loads(entry.read_text())["mark"].encode()
        p, notes = cli(rt, inv, sshd, "--json", *base, env={"AHEAD_TEST_DIES": "1"})
        assert p.returncode == 9 and marks_sent(p) == [[dying]], "the killed CLI sent its remembered request"
        p, notes = cli(rt, inv, sshd, "--json", *base)
        assert p.returncode == 1 and DECISIVE in p.stdout, p.stderr
        assert all(dying not in m for m in marks_sent(p)), "the killed CLI's marker was sent again"
        # 7. the keeper dies after the early request left: the CLI's own request goes to the keeper it
        # starts, as it would without send-ahead (not a lost keeper's error for a healthy host)
        (keeper,) = pids_with("fleetdiag.ssh.keeper", str(rt))
        p, notes = cli(rt, inv, sshd, "--json", *base, env={"AHEAD_TEST_KILLS": str(keeper)})
        assert notes[0] == [] and p.returncode == 1, (notes, p.stdout, p.stderr)
        assert DECISIVE in json.loads(p.stdout)["hosts"][0]["decisive"]["line"]
    finally:
        keeper_client.close_kept(rt)


async def held(sshd, rt: Path) -> keeper_client.KeptConnection:
    """The host's kept connection, open: its first command (the open too) has run through the keeper."""
    conn = await keeper_client.open_kept("127.0.0.1", sshd.port, sshd.user, sshd.opts(), None, "h", 30.0, rt)
    assert (await conn.execute("true", 10)).status == 0
    return conn


def test_kept_only_is_never_dialled(sshd, rt):
    """A request sent ahead runs only on a connection the keeper holds: it never dials for one."""
    params = connect_params("127.0.0.1", sshd.port, sshd.user, sshd.opts(), None)
    key = connection_key(params)

    async def go() -> dict:
        conn = await held(sshd, rt)
        other = dict(params, user="nobody-here")
        req = {"op": "run", "key": key + "x", "params": other, "command": "echo hi", "timeout": 5, "kept_only": True}
        reader, writer = await keeper_client._request(rt, req, 3.0)
        frame = await wire.recv(reader)
        writer.close()
        run = await conn.execute("echo kept", 10)
        return {"end": json.loads(frame[1:]), "kind": frame[:1], "kept": run.stdout}

    async def gone() -> tuple[bytes, int | None]:
        """A client that leaves mid-answer stops its own command, not the connection under another one."""
        conn = await held(sshd, rt)
        chatty = "echo a; sleep 1; i=0; while [ $i -lt 200 ]; do echo b$i; i=$((i+1)); sleep 0.01; done"
        req = {"op": "run", "key": conn.key, "params": conn.params, "command": chatty, "timeout": 20}
        reader, writer = await keeper_client._request(rt, req, 3.0)
        other = asyncio.ensure_future(conn.execute("sleep 4; echo still here", 20))
        assert (await wire.recv(reader))[:1] == b"O"
        writer.close()  # gone, with the chatty command still writing
        run = await other
        return run.stdout, run.status

    try:
        got = asyncio.run(go())
        assert got["kind"] == b"X" and got["end"]["kind"] == wire.NOT_KEPT
        assert got["kept"] == b"kept\n"
        assert len(keeper_client.list_kept(rt) or []) == 1, "nothing was dialled for the kept-only request"
        assert asyncio.run(gone()) == (b"still here\n", 0)
        assert len(keeper_client.list_kept(rt) or []) == 1, "the connection stayed"
    finally:
        keeper_client.close_kept(rt)


def test_a_commands_output_reaches_its_client_in_few_frames(sshd, rt):
    """The keeper relays a command's output in few frames (the first piece at once, then at most one each
    ``RELAY_EVERY``, the rest before the end record), not one per channel packet: 60 lines written one
    by one arrive whole, in order, in a handful of frames; the first still before the command ends."""
    from fleetdiag.ssh.keeper.server import RELAY_EVERY

    async def go() -> tuple[list[tuple[float, bytes]], float]:
        conn = await held(sshd, rt)
        chatty = "i=0; while [ $i -lt 60 ]; do echo line$i; i=$((i+1)); sleep 0.01; done; echo oops >&2"
        req = {"op": "run", "key": conn.key, "params": conn.params, "command": chatty, "timeout": 30}
        t0 = time.monotonic()
        reader, writer = await keeper_client._request(rt, req, 3.0)
        frames = []
        while not frames or frames[-1][1][:1] != b"X":
            frames.append((time.monotonic(), await wire.recv(reader)))
        writer.close()
        return frames, frames[-1][0] - t0

    try:
        frames, took = asyncio.run(go())
    finally:
        keeper_client.close_kept(rt)
    out = [f for _, f in frames if f[:1] == b"O"]
    assert b"".join(f[1:] for f in out) == b"".join(b"line%d\n" % i for i in range(60))
    assert b"".join(f[1:] for _, f in frames if f[:1] == b"E") == b"oops\n"
    assert json.loads(frames[-1][1][1:])["status"] == 0
    assert len(out) <= 2 + took / RELAY_EVERY, (len(out), took)  # one a channel packet: ~60
    assert frames[0][0] < frames[-1][0] - 0.2, "the first piece went out while the command still ran"


# The console entry again, noting for each `sh` started whether the CLI was imported by then.
LOCAL_ENTRY = r"""
import os, subprocess, sys
HEAVY = ("click", "rich", "fleetdiag.cli", "fleetdiag.analysis", "yaml")
notes = []
class Noting(subprocess.Popen):
    def __init__(self, args, *a, **kw):
        if args and args[0] == "sh":
            notes.append(sorted(m for m in HEAVY if m in sys.modules))
        super().__init__(args, *a, **kw)
subprocess.Popen = Noting
_exit = os._exit
def exit_saying(code):
    sys.stderr.write("AHEAD-NOTES " + repr(notes) + "\n")
    sys.stderr.flush()
    _exit(code)
os._exit = exit_saying
from fleetdiag.entry import run
run()
"""


def test_analyze_starts_its_funnel_before_the_imports(rt, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    rules = tmp_path / "rules.yaml"
    rules.write_text("keywords: ['DP adjusted local rank']\n")
    env = cli_env(rt)

    def analyze(*extra: str, off: bool = False) -> tuple[dict, list]:
        argv = [sys.executable, "-c", LOCAL_ENTRY, "--rules", str(rules), "analyze", str(log), "--json", *extra]
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**env, "FLEETDIAG_AHEAD": "0" if off else "1"},
        )
        assert p.returncode == 1, p.stderr
        line = next(ln for ln in p.stderr.splitlines() if ln.startswith("AHEAD-NOTES "))
        doc = json.loads(p.stdout)
        doc.pop("idle_seconds", None)  # the log's age at each run
        doc.pop("timing", None)
        return doc, eval(line.split(" ", 1)[1])

    first, notes = analyze()
    assert len(notes) == 1 and "fleetdiag.analysis" in notes[0]  # its own funnel, after the rules
    second, notes = analyze()
    assert notes == [[]], "the funnel started before click, rich, yaml or the analysis were imported"
    off, notes = analyze(off=True)
    assert second == off == first and DECISIVE in second["decisive"]["line"]
    # rules edited in place: the early funnel runs the old script, is stopped; the answer is the new one's
    rules.write_text("keywords: ['nothing matches this']\n")
    changed, notes = analyze()
    assert len(notes) == 1 and "fleetdiag.analysis" in notes[0], notes  # the old entry's rules file changed
    assert changed == analyze(off=True)[0]
    # the log grows between two runs: the early funnel reads it as it is when the command starts
    analyze()
    with log.open("a") as fh:
        fh.write("INFO 05-09 15:16:00 [core.py:1] all fine again\n")
    grown, notes = analyze()
    assert notes == [[]] and grown == analyze(off=True)[0]


def test_an_early_request_the_keeper_does_not_hold_is_sent_again(sshd, rt, monkeypatch):
    """The early request for a connection the keeper no longer holds is not run; the command's own
    request is, and the keeper dials for it as it always does."""
    from fleetdiag.ssh.keeper import ahead

    monkeypatch.setenv("FLEETDIAG_RUNTIME_DIR", str(rt))
    monkeypatch.setenv("FLEETDIAG_KEEPER_HELLO", "3")  # a loaded machine's keeper still answers
    first = connect_params("127.0.0.1", sshd.port, sshd.user, sshd.opts(), None)
    other = connect_params("127.0.0.1", sshd.port, sshd.user, sshd.opts(keepalive=17.0), None)
    key = connection_key(other)
    assert key != connection_key(first)
    req = {"op": "run", "key": key, "params": other, "label": "h", "persist": 30.0}
    req.update(command="echo ran here", timeout=10, cap=wire.OUTPUT_CAP)
    argv = ["fleetdiag", "probe", "h"]

    async def go() -> tuple[bytes, int]:
        await held(sshd, rt)
        ahead._save(rt, ahead.argv_key(argv[1:], os.getcwd(), dict(os.environ)), {"request": req, "mark": "m"})
        assert ahead.send_early(argv)  # the keeper answers at once; it holds `first`, not `other`
        conn = keeper_client.KeptConnection(rt, key, other, "h", 30.0, 1.0, False)
        run = await conn.execute("echo ran here", 10)
        assert ahead._early is not None and ahead._early.used  # its answer was read: not kept, so sent again
        return run.stdout, len((await keeper_client._ask(rt, {"op": "list"}, 5.0))["connections"])

    try:
        assert asyncio.run(go()) == (b"ran here\n", 2)
    finally:
        ahead.reset()
        keeper_client.close_kept(rt)


# A stand-in awk on the PATH: armed, its first run records its pid and sleeps (a long pass over a big log)
SLOW_AWK = """#!/bin/sh
if [ -e "$AHEAD_TEST_FLAGS/armed" ] && mkdir "$AHEAD_TEST_FLAGS/taken" 2>/dev/null; then
  echo $$ > "$AHEAD_TEST_FLAGS/pid"
  sleep 60
fi
exec {awk} "$@"
"""


def test_an_early_funnel_not_taken_is_stopped_with_its_children(rt, tmp_path):
    """The early funnel's whole process group goes when the CLI does not take its output: a script that
    changed (a user rules file that appeared since), a CLI that fails first (a --kernel file gone) or one
    killed. Killing its ``sh`` alone left the pipeline under it reading the log to its end."""
    import shutil

    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    kernel = tmp_path / "kern.log"
    flags, bindir = tmp_path / "flags", tmp_path / "bin"
    flags.mkdir()
    bindir.mkdir()
    (bindir / "awk").write_text(SLOW_AWK.format(awk=shutil.which("awk")))
    (bindir / "awk").chmod(0o755)
    cfg = tmp_path / "cfg"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = cli_env(
        rt,
        XDG_CONFIG_HOME=str(cfg),
        AHEAD_TEST_FLAGS=str(flags),
        PATH=f"{bindir}:{os.environ['PATH']}",
        TMPDIR=str(tmpdir),
    )
    argv = [sys.executable, "-c", LOCAL_ENTRY, "analyze", str(log), "--json", "--kernel", str(kernel)]

    def analyze() -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)

    def stopped() -> bool:
        pid = int((flags / "pid").read_text())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                return True
            if state == "Z":
                return True
            time.sleep(0.05)
        return False

    def arm() -> None:
        shutil.rmtree(flags / "taken", ignore_errors=True)
        (flags / "pid").unlink(missing_ok=True)
        (flags / "armed").touch()

    kernel.write_text("[    1.000000] Linux version 6.8.0\n")
    p = analyze()  # remembers its funnel
    assert p.returncode == 1 and DECISIVE in p.stdout, p.stderr
    # a user rules file appears: the early funnel (the old script) is not taken; the answer is the new one's
    (cfg / "fleetdiag").mkdir(parents=True)
    (cfg / "fleetdiag" / "rules.yaml").write_text("keywords: ['nothing matches this']\n")
    arm()
    p = analyze()
    assert p.returncode == 1 and DECISIVE in p.stdout, p.stderr
    notes = eval(next(ln for ln in p.stderr.splitlines() if ln.startswith("AHEAD-NOTES ")).split(" ", 1)[1])
    assert len(notes) == 2 and notes[0] == [] and "fleetdiag.analysis" in notes[1], notes  # early, then its own
    assert stopped(), "the early funnel's pipeline outlived the command"
    # the CLI fails before it takes the output: the early funnel goes with it
    arm()
    kernel.unlink()
    p = analyze()
    assert p.returncode == 2 and "no such file" in p.stderr, p.stderr
    assert stopped(), "the early funnel's pipeline outlived the failed command"
    # the CLI killed while its early funnel runs (SIGKILL, as SIGTERM or a closed terminal: no atexit runs): the
    # funnel's group goes too, and neither a temp file nor a claimed entry is left
    kernel.write_text("[    1.000000] Linux version 6.8.0\n")
    assert analyze().returncode == 1  # remembers its funnel again
    arm()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path, env=env)
    deadline = time.monotonic() + 60
    while not (flags / "pid").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (flags / "pid").exists(), "the early funnel did not start"
    proc.kill()
    proc.wait()
    assert stopped(), "the early funnel's pipeline outlived the killed command"
    assert not list(tmpdir.iterdir()) and not list((rt / "ahead").glob(".*")), "a killed command left files"
