"""The output edge: what a host or an inventory value can put on the operator's terminal, and ``--redact``.

Every command's text output goes through one ``render.Output``: control characters, C1 controls and bidi
overrides from host data are shown as escapes (``\\x1b``), rich markup in data is text, and ``--redact``
is applied there once. JSON keeps the raw text, escaped by JSON.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.cli import main
from fleetdiag.records import FAILED, Decisive, HostResult
from fleetdiag.redact import Redactor, redact_argv, redact_env
from fleetdiag.render import Output, host_card, visible

from .cli_env import cli_env
from .sshd import start_sshd
from .test_facts import SMI, fake_nvidia_smi

TRACEBACK = (
    b"INFO 05-09 15:14:00 [api_server.py:1] vLLM API server version 0.9.0\n"
    b"Traceback (most recent call last):\n"
    b'  File "/srv/app.py", line 1, in <module>\n'
)
# OSC 52 (clipboard) nested in OSC 0 (title) so a one-pass strip re-forms it; ESC c (reset), ESC (0 (line
# drawing), ESC #8 (screen fill), C1 CSI, BEL, a bidi override and an isolate, and rich markup.
HOSTILE = (
    "RuntimeError: x \x1b\x1b]0;a\x07]52;c;Y3VybA==\x1b\x1b]0;b\x07\\ \x1bc \x1b(0 \x1b#8 \x9b31m "
    "\u202egnp.exe\u2066 [bold]B[/bold] :smile:\n"
)
BIDI = {*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))}


def controls(text: str) -> list[str]:
    """Characters a terminal would act on: C0 but newline/tab, DEL, C1, bidi overrides and isolates."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 or c in BIDI]


def assert_inert(text: str, what: str) -> None:
    bad = controls(text)
    assert not bad, f"{what}: {sorted(set(bad))!r} reached the output:\n{text}"


def strings(o: object) -> str:
    """Every string inside a parsed JSON value, joined (the raw text, as the record holds it)."""
    if isinstance(o, str):
        return o
    if isinstance(o, dict):
        return "\n".join(strings(v) for v in o.values())
    if isinstance(o, list):
        return "\n".join(strings(v) for v in o)
    return ""


def write_hostile(path: Path) -> Path:
    path.write_bytes(TRACEBACK + HOSTILE.encode())
    return path


def _run(*args: str) -> object:
    return CliRunner().invoke(main, ["--no-color", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})


# ============================================================================ the neutraliser


def test_visible_is_total_and_nothing_reforms():
    out = visible(HOSTILE)
    assert not controls(out)
    assert "\\x07]52;c;Y3VybA==" in out and "\\x9b31m" in out and "\\u202e" in out and "\\u2066" in out
    assert visible(out) == out  # printable ASCII replacements: a second pass changes nothing
    assert visible("a\tb\nc") == "a\tb\nc" and visible("a\tb\nc", one_line=True) == "a\\tb\\nc"
    assert visible("ünïcode ✓ 日本") == "ünïcode ✓ 日本"  # only controls change


def test_console_edge_catches_text_that_skipped_the_records():
    """Even a renderable built from raw host text (not passed through Output.shown) is made visible."""
    buf = io.StringIO()
    out = Output(stdout=buf, color=False, width=200)
    out.out.print(HOSTILE)
    res = HostResult(host="h\x1b]0;t\x07", verdict=FAILED, decisive=Decisive(line=HOSTILE, message=HOSTILE))
    out.out.print(host_card(res))
    text = buf.getvalue()
    assert_inert(text, "console")
    assert "[bold]B[/bold]" in text and ":smile:" in text  # markup and emoji codes in data stay text


# ============================================================================ every command's text output


def test_hostile_log_through_every_command(sshd, tmp_path):
    log = write_hostile(tmp_path / "vllm.log")
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        json.dumps(
            {
                "hosts": {
                    "gpu01": {"address": "127.0.0.1", "port": sshd.port, "user": sshd.user, "logs": {"vllm": str(log)}}
                }
            }
        )
    )
    base = ["-i", str(inv)]
    outputs: dict[str, str] = {}

    r = _run("analyze", str(log))
    assert r.exit_code == 1, r.output
    outputs["analyze"] = r.output
    r = _run(*base, "probe", "gpu01", *sshd.cli_args())
    assert r.exit_code == 1, r.output
    outputs["probe"] = r.output
    db, report = tmp_path / "h.db", tmp_path / "report.json"
    r = _run(*base, "sweep", "all", "--db", str(db), "--report", str(report), *sshd.cli_args())
    assert r.exit_code == 1, r.output
    outputs["sweep"] = r.output
    r = _run(*base, "history", "--db", str(db))
    assert r.exit_code == 0, r.output
    outputs["history"] = r.output
    r = _run(*base, "watch", "gpu01", "--duration", "3", "--no-facts", *sshd.cli_args())
    assert r.exit_code == 1, r.output
    outputs["watch"] = r.output
    for name, text in outputs.items():
        assert_inert(text, name)
        assert "\\x1b" in text, f"{name}: the escape is not shown\n{text}"
        assert "[bold]B[/bold]" in text or name in ("sweep", "history", "watch"), name  # one-line views may cut

    # JSON keeps the raw text, escaped by JSON: nothing raw on the wire, the record intact after parsing
    for args in (
        ["analyze", str(log), "--json"],
        [*base, "probe", "gpu01", "--json", *sshd.cli_args()],
        [*base, "history", "--db", str(db), "--json"],
    ):
        r = _run(*args)
        assert_inert(r.output, " ".join(args[:3]))
        assert "\x1b" in strings(json.loads(r.output)), args[:3]
    r = _run(*base, "watch", "gpu01", "--duration", "3", "--no-facts", "--jsonl", *sshd.cli_args())
    assert_inert(r.output, "watch --jsonl")
    events = [json.loads(ln) for ln in r.output.splitlines()]
    assert "\x1b" in strings(events), events


def test_hostile_gpu_name_and_model_through_preflight(sshd, tmp_path):
    csv = tmp_path / "query.csv"
    csv.write_text((SMI / "nvidia-smi-query.csv").read_text().replace("NVIDIA H200", "NVIDIA \x1b]0;pwn\x07H200\u202e"))
    bindir = fake_nvidia_smi(tmp_path / "bin", query=str(csv))
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"hosts:\n  uk-node:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n")
    model = "/tmp/no-such-model-\x1b]52;c;eA==\x07-\u202e"
    r = _run(
        "-i",
        str(inv),
        "preflight",
        "uk-node",
        "--path-prepend",
        str(bindir),
        *sshd.cli_args(),
        "--",
        "vllm",
        "serve",
        model,
        "-tp",
        "2",
    )
    assert r.exit_code == 1, r.output  # the model path does not exist
    assert_inert(r.output, "preflight")
    assert "\\x1b]0;pwn\\x07" in r.output and "\\x1b]52" in r.output


def test_hostile_but_valid_inventory_values_in_hosts_and_check(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        json.dumps(
            {"hosts": {"gpu01": {"address": "127.0.0.1", "logs": {"vllm": "/var/log/\x1b]0;t\x07[bold]x\u202e.log"}}}}
        )
    )
    for args in (["hosts"], ["hosts", "all"], ["check"]):
        r = _run("-i", str(inv), *args)
        assert r.exit_code in (0, 2), r.output  # a future check may refuse the value: then it names it, inert
        assert_inert(r.output, " ".join(args))
    r = _run("-i", str(inv), "hosts")
    if r.exit_code == 0:
        assert "[bold]x\\u202e.log" in r.output


# A 50 MB answer of one line (no newline), with NULs, invalid UTF-8, OSC/CSI/C1 sequences: what a host whose
# login prints a binary file to every command sends (ForceCommand cat blob)
BLOB_CHUNK = b"\x00\xff\xfe\xc3(\x1b]0;pwn\x07\x1b]52;c;Y3VybA==\x07\x1b[2J\x9b31m\xe2\x80\xae" + b"A" * 4000
BLOB_MB = 50
ENTRY = "from fleetdiag.entry import run; run()"  # the console entry, as `fleetdiag` runs it
# runs argv, then writes its peak RSS (KiB, from its own wait4) last on stderr
PEAK_RSS = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "sys.stderr.write(f'PEAK-RSS-KB {usage.ru_maxrss}')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


@pytest.fixture(scope="module")
def blob_sshd(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("blob")
    blob = work / "blob.bin"
    with blob.open("wb") as fh:
        for _ in range(BLOB_MB * 1024 * 1024 // len(BLOB_CHUNK) + 1):
            fh.write(BLOB_CHUNK)
    server = start_sshd(work / "sshd", extra_config=f"ForceCommand exec cat {blob}\n")
    yield server
    server.stop()


def test_hostile_hosts_stay_inert_and_bounded_and_the_others_finish(sshd, blob_sshd, tmp_path):
    """One host answers 50 MB of one binary line, one runs a job whose command line carries OSC/CSI
    sequences and a bidi override (its discovered log holds NULs and invalid UTF-8): through the CLI, the
    card and the JSON hold no control character, the CLI's peak RSS stays bounded, the others finish."""
    log = tmp_path / "vllm.log"
    log.write_bytes(TRACEBACK + HOSTILE.encode())
    ok = tmp_path / "ok.log"
    ok.write_text(
        "INFO 05-09 15:14:00 [api_server.py:1] vLLM API server version 0.9.0\nINFO:     Application startup complete.\n"
        'INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK\n'
    )
    job = tmp_path / "job"
    job.mkdir()
    (job / "out.log").write_bytes(b"INFO start \x00\xff\xfe\x1b]0;t\x07\n" + TRACEBACK + b"ValueError: \xc3( bad\n")
    exe = job / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    exe.chmod(0o755)
    argv0 = ["vllm", "\x1b]0;pwn\x07serve\x1b[2J\u202e", "m\x9b31m"]
    with (job / "out.log").open("ab") as out:
        proc = subprocess.Popen(argv0, executable=str(exe), stdout=out, stderr=out, cwd=job, start_new_session=True)
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts.read_text() + blob_sshd.known_hosts.read_text())
    hosts = {
        "blob": {"address": "127.0.0.1", "port": blob_sshd.port, "user": sshd.user, "logs": {"app": str(ok)}},
        "gpu-fail": {"address": "127.0.0.1", "port": sshd.port, "user": sshd.user, "logs": {"app": str(log)}},
        "gpu-job": {"address": "127.0.0.1", "port": sshd.port, "user": sshd.user},
        "gpu-ok": {"address": "127.0.0.1", "port": sshd.port, "user": sshd.user, "logs": {"app": str(ok)}},
    }
    inv = tmp_path / "inv.yaml"
    inv.write_text(json.dumps({"hosts": hosts}))
    ssh = ["--known-hosts", str(known), "--identity", str(sshd.client_key), "--identity", str(blob_sshd.client_key)]
    env = cli_env(tmp_path / "rt", COLUMNS="200", FLEETDIAG_PERSIST="0")

    def cli(*args: str) -> tuple[int, str, str, float, float]:
        """exit code, stdout, stderr, seconds, the CLI's peak RSS in MiB (its own wait4, from PEAK_RSS)."""
        t0 = time.monotonic()
        argv = [sys.executable, "-c", PEAK_RSS, sys.executable, "-c", ENTRY, "--no-color", "-i", str(inv)]
        p = subprocess.run([*argv, *args, *ssh], capture_output=True, timeout=120, env=env)
        err = p.stderr.decode("utf-8", "replace")
        head, _, peak = err.rpartition("PEAK-RSS-KB ")
        return p.returncode, p.stdout.decode("utf-8", "replace"), head, time.monotonic() - t0, int(peak) / 1024

    try:
        code, text, err, secs, rss = cli("probe", "all")
        print(f"probe: {secs:.1f} s, peak RSS {rss:.0f} MiB")
        assert code == 1, err
        assert_inert(text, "probe")
        assert_inert(err, "probe (stderr)")
        rows = {ln.split()[1]: ln for ln in text.splitlines() if ln.startswith("│ ") and len(ln.split()) > 2}
        assert "unreachable" in rows["blob"] and "MiB of output" in text, text  # read up to the cap, then dropped
        assert "failed" in rows["gpu-fail"] and "healthy" in rows["gpu-ok"] and "failed" in rows["gpu-job"], text
        assert "\\x1b]0;pwn\\x07serve\\x1b[2J\\u202e" in text, text  # the job's command line, shown inert
        assert rss < 160, f"peak RSS {rss:.0f} MiB"  # the 50 MB answer is never held
    finally:
        proc.kill()
        proc.wait()


# ============================================================================ --redact, over every command

SECRETS_LOG = (
    b"INFO 05-09 15:14:00 [api_server.py:1] vLLM API server version 0.9.0\n"
    b"(Worker pid=9001) ERROR 05-09 15:16:00 [client.py:12] Traceback (most recent call last):\n"
    b'(Worker pid=9001) ERROR 05-09 15:16:00 [client.py:12]   File "/home/alice/venv/x.py", line 3, in dial\n'
    b"(Worker pid=9001) ERROR 05-09 15:16:00 [client.py:12] ConnectionRefusedError: [Errno 111] on gpu-prod-17 "
    b"('10.20.30.40', 29500) HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyzABCDEF redis://:redispw123@cache.internal:6379 "
    b"MYSQL_PWD=mysqlpw456 DB_PASS=dbpw789 curl -u admin:curlpw321 https://dave:p@ssw0rd@db.internal/x "
    b"ssh://erin@git.internal\n"
)
SENSITIVE = (
    "gpu-prod-17",
    "gpu-prod-18",
    "198.51.100.23",
    "prod-bastion",
    "10.20.30.40",
    "alice",
    "hf_abcdefghijklmnopqrstuvwxyzABCDEF",
    "redispw123",
    "mysqlpw456",
    "dbpw789",
    "curlpw321",
    "p@ssw0rd",
    "ssw0rd",
    "dave",
    "erin",
    "cache.internal",
    "db.internal",
    "git.internal",
)


def test_redact_hides_names_addresses_and_tokens_in_every_command(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(SECRETS_LOG)
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "hosts:\n"
        f"  gpu-prod-17:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs: {{vllm: {log}}}\n"
        f"  gpu-prod-18:\n    address: 198.51.100.23\n    port: 1\n    jump: prod-bastion\n    logs: {{vllm: {log}}}\n"
    )
    base = ["--redact", "-i", str(inv)]
    ssh = [*sshd.cli_args(), "--connect-timeout", "2"]
    db, report, payload = tmp_path / "h.db", tmp_path / "report.json", tmp_path / "notify.json"
    bindir = fake_nvidia_smi(tmp_path / "bin")
    runs = {
        "probe": [*base, "probe", "all", "--all-cards", *ssh],
        "probe --json": [*base, "probe", "all", "--json", *ssh],
        "probe --jsonl": [*base, "probe", "all", "--jsonl", *ssh],
        "analyze": [*base, "analyze", str(log)],
        "analyze --json": [*base, "analyze", str(log), "--json"],
        "hosts": [*base, "hosts", "all"],
        "hosts --json": [*base, "hosts", "--json"],
        "hosts --jsonl": [*base, "hosts", "--jsonl"],
        "check": [*base, "check"],
        "preflight": [
            *base,
            "preflight",
            "gpu-prod-17",
            "--path-prepend",
            str(bindir),
            *ssh,
            "--",
            "vllm",
            "serve",
            "m",
            "-tp",
            "2",
        ],
        "preflight --json": [
            *base,
            "preflight",
            "all",
            "--json",
            "--path-prepend",
            str(bindir),
            *ssh,
            "--",
            "vllm",
            "serve",
            "m",
            "-tp",
            "2",
        ],
        "watch": [*base, "watch", "all", "--duration", "3", "--grace", "0", "--no-facts", *ssh],
        "watch --jsonl": [*base, "watch", "all", "--duration", "3", "--grace", "0", "--no-facts", "--jsonl", *ssh],
        "sweep": [
            *base,
            "sweep",
            "all",
            "--db",
            str(db),
            "--report",
            str(report),
            "--notify",
            f"cat > {payload}",
            *ssh,
        ],
        "history": [*base, "history", "--db", str(db)],
        "history --json": [*base, "history", "--db", str(db), "--json"],
        "history selector": [*base, "history", "gpu-prod-17", "--db", str(db)],
    }
    outputs: dict[str, str] = {}
    for name, args in runs.items():
        r = _run(*args)
        assert r.exit_code in (0, 1, 3), (name, r.exit_code, r.output)
        outputs[name] = r.output
    outputs["report"] = report.read_text()
    outputs["notify payload"] = payload.read_text()
    for name, text in outputs.items():
        for s in SENSITIVE:
            assert s not in text, f"{s!r} leaked in {name}:\n{text}"
    assert "host-1" in outputs["hosts"] and "host-2" in outputs["hosts"] and "ip-" in outputs["hosts"]
    assert "host-1" in outputs["history"] and "<redacted>" in outputs["probe --json"]
    assert json.loads(outputs["notify payload"])["new"], outputs["notify payload"]
    # without --redact it is all there (the test would pass on an empty output otherwise)
    plain = _run(*base[1:], "hosts", "all").output + _run(*base[1:], "history", "--db", str(db)).output
    assert "gpu-prod-17" in plain and "198.51.100.23" in plain


@pytest.mark.parametrize(
    "text,hidden",
    [
        ("redis://:redispw123@cache.internal:6379/0", "redispw123"),
        ("MYSQL_PWD=mysqlpw456 mysql -h db", "mysqlpw456"),
        ("export DB_PASS=dbpw789", "dbpw789"),
        ("curl -u admin:curlpw321 https://api", "curlpw321"),
        ("curl --user=admin:curlpw321 https://api", "curlpw321"),
        ("postgres://dave:p@ssw0rd@db.internal:5432/x", "ssw0rd"),
        ("https://dave:secret@db.internal/x", "dave"),
        ("git clone ssh://erin@git.internal/repo", "erin"),
    ],
)
def test_redact_patterns(text, hidden):
    out = Redactor(local=False).text(text)
    assert hidden not in out, out


def test_redact_keeps_ordinary_words():
    r = Redactor(local=False)
    for keep in ("compass=north", "bypass the cache", "passes=3", "http://host:8080/x"):
        assert r.text(keep) == keep


def test_command_line_masking_is_redacts():
    """facts masks serving command lines with the one list of secret names in redact.py."""
    from fleetdiag import facts

    assert facts.redact_argv is redact_argv
    argv = ["curl", "-u", "admin:pw1", "DB_PASS=pw2", "MYSQL_PWD=pw3", "--api-key", "pw4", "http://u:pw5@h/x"]
    assert not any(f"pw{i}" in " ".join(redact_argv(argv)) for i in range(1, 6)), redact_argv(argv)
    assert redact_env({"DB_PASS": "x", "PATH": "/bin"}) == {"DB_PASS": "***", "PATH": "/bin"}


def test_output_writes_json_raw_and_redacted(tmp_path):
    buf = io.StringIO()
    out = Output(stdout=buf, redactor=Redactor(hosts=["gpu-prod-17"], local=False))
    out.jsonl({"host": "gpu-prod-17", "line": "a\x1bb"})
    doc = json.loads(buf.getvalue())
    assert doc == {"version": 1, "host": "host-1", "line": "a\x1bb"} and "\x1b" not in buf.getvalue()


def test_progress_line_names_hosts_redacted_and_visible():
    """The live progress line (stderr, a terminal) goes through the Output too: --redact and the neutraliser."""
    from types import SimpleNamespace

    from fleetdiag.render import FleetProgress

    out = Output(stderr=io.StringIO(), redactor=Redactor(hosts=["gpu-prod-17"], local=False))
    bar = FleetProgress(out.err, 2, enabled=False)
    bar(SimpleNamespace(running={"gpu-prod-17": 0.0, "x\x1b]0;t\x07": 1.0}, counts={}, done=0))
    assert "host-1" in bar.status().plain and "gpu-prod-17" not in bar.status().plain
    bar(SimpleNamespace(running={"x\x1b]0;t\x07": 0.0}, counts={}, done=0))
    assert not controls(bar.status().plain)
