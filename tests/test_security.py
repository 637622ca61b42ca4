"""Nothing executes that should not, nothing is written on the remote, nothing secret is printed.

- Hostile values (``$(...)``, backticks, ``;``, ``&&``, quotes, newlines, a
  leading ``-``) in every value that reaches the remote host: each carries a
  canary command, and no canary file may appear anywhere.
- The remote script writes nothing: a snapshot of the remote user's home, cwd,
  TMPDIR and the log's directory is unchanged, and (where strace runs) no
  system call of the whole remote command opens a file for writing except
  /dev/null or creates, renames, links or removes anything.
- It runs niced, in the idle I/O class, and under ``timeout``.
- ``--redact`` in every output format; passphrases never printed or stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import sqlite3
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.analysis import load_rules
from fleetdiag.cli import main
from fleetdiag.inventory import Host
from fleetdiag.probe import ProbeSettings, probe_host, spec_for
from fleetdiag.records import FAILED, HostResult
from fleetdiag.redact import Redactor, redact_result, redact_text
from fleetdiag.remote import funnel as funnel_mod
from fleetdiag.ssh.transport import TransportOptions, connect

from .conftest import inventory_file
from .faults import Behaviour, FaultServer, ServerThread
from .test_reliability import DECISIVE, SEED, make_host, toolbox, write_log

RULES = load_rules(user_default=False)
CANARY = "fdcanary" + uuid.uuid4().hex[:12]


def hostile_values(c: str = f"{CANARY}-rel /tmp/{CANARY}-abs") -> list[str]:
    """Shell metacharacters around a command that would leave canary files (relative and absolute)."""
    return [
        f"$(touch {c})",
        f"`touch {c}`",
        f"; touch {c}",
        f"&& touch {c}",
        f"| touch {c}",
        f"|| touch {c} #",
        f"' ; touch {c} ; '",
        f'" ; touch {c} ; "',
        f"\ntouch {c}\n",
        f"-e touch {c}",
        f"--version; touch {c}",
        f"${{IFS}}$(touch${{IFS}}{c})",
        f"\\$(touch {c})",
        f"$'\\x74ouch' {c}",
        f"*; touch {c}",
        f"%s%n $(touch {c})",
        f"[/bold] \\\n`touch {c}`",
    ]


# The list, for the slower end-to-end paths: $(...), backticks, ;, &&, quotes, newlines, leading -.
CORE = [v for i, v in enumerate(hostile_values()) if i in (0, 1, 2, 3, 6, 8, 9, 16)]


def canary_places(*extra: Path) -> list[Path]:
    return [Path.home(), Path.cwd(), Path("/tmp"), Path("/"), *extra]


def assert_no_canary(*extra: Path) -> None:
    for where in canary_places(*extra):
        found = [p for p in where.glob(CANARY + "*")] if where.exists() else []
        assert not found, f"a hostile value ran a command: {found}"


def snapshot(*dirs: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``dirs`` with its mtime and size."""
    out: dict[str, tuple[int, int]] = {}
    for d in dirs:
        for p in [d, *d.rglob("*")]:
            st = p.lstat()
            out[str(p)] = (st.st_mtime_ns, st.st_size)
    return out


def run(coro):
    return asyncio.run(coro)


# ============================================================================ hostile values


def test_hostile_values_in_every_funnel_field_run_nothing(sshd, tmp_path):
    """Straight into the generated script (no inventory validation in the way): the log path,
    keyword, run_start and tag patterns and the facts' variables, each hostile, through real sshd."""
    logdir = tmp_path / "logs"
    logdir.mkdir()
    log = write_log(logdir / "vllm.log", SEED)
    values = hostile_values()
    before = snapshot(logdir)
    fields = ("keywords", "run_start", "tags", "extra_vars")

    async def go():
        conn = await connect("127.0.0.1", sshd.port, sshd.user, sshd.opts())

        slots = asyncio.Semaphore(6)  # a few sessions at once: each command's 30 s runs while it runs

        async def once(spec):
            mark = funnel_mod.new_mark()
            async with slots:
                out, _status, _, _ = await conn.run(funnel_mod.remote_command(funnel_mod.build_script(spec, mark)), 30)
            fr = funnel_mod.parse_output(out.decode("utf-8", "replace"), mark)
            assert funnel_mod.CUT not in fr.markers  # the script ran to its end
            return fr

        def patterns(i: int):
            spec = spec_for(str(log), RULES)  # the real log, hostile patterns: every value in every field
            for k, field in enumerate(fields):
                w = values[(i + k) % len(values)]
                if field == "extra_vars":
                    spec.extra_vars = {"FD_EXTRA": w}
                else:
                    setattr(spec, field, w)
            return spec

        try:  # the scripts side by side on the one connection (a session each)
            paths = [once(spec_for(str(logdir / v), RULES)) for v in values]  # a hostile log path
            found = await asyncio.gather(*paths, *(once(patterns(i)) for i in range(len(values))))
            assert all(fr.status == "ok" for fr in found[len(values) :])
            return list(zip(values, found[: len(values)]))
        finally:
            conn.close()

    missing = run(go())
    assert_no_canary(logdir)
    assert snapshot(logdir) == before
    for v, fr in missing:  # the values were data: a hostile log name is looked up literally
        assert fr.status in ("missing", "no-match"), (v, fr.status)
        assert fr.path == str(logdir / v)


def test_hostile_log_name_that_exists_is_read_literally(sshd, tmp_path):
    logdir = tmp_path / "logs"
    logdir.mkdir()
    logs = [write_log(logdir / (v.replace("/", "_") + ".log"), SEED) for v in CORE]
    settings = ProbeSettings(transport=sshd.opts(), rules=RULES)

    async def go() -> list[HostResult]:  # the hosts at once, as a fleet's probes run
        return await asyncio.gather(*(probe_host(make_host(sshd.port, log, user=sshd.user), settings) for log in logs))

    for v, log, res in zip(CORE, logs, run(go())):
        assert res.verdict == FAILED and res.log == str(log), (v, res.error)
        assert DECISIVE in res.decisive.line
    assert_no_canary(logdir)


def _inventory(path: Path, sshd, log: str, funnel: dict | None = None) -> Path:
    # JSON is YAML: every byte of the value survives quoting
    return inventory_file(path, {"gpu01": {"log": log, **({"funnel": funnel} if funnel else {})}}, sshd)


def _cli(sshd, inv: Path, *args: str, extra: tuple[str, ...] = ()) -> object:
    return CliRunner().invoke(
        main,
        [
            *extra,
            "-i",
            str(inv),
            *args,
            *sshd.cli_args(),
        ],
    )


@pytest.mark.parametrize("channel", ["inventory-log", "--log", "run_start", "rules", "selector"])
def test_hostile_values_through_the_cli(sshd, tmp_path, channel):
    """Inventory log path, --log, a run_start override, user rules patterns and selectors, via the CLI.
    The inventory's channels put every value the inventory accepts on a host of one inventory, probed at
    once; a value it refuses is refused on its own."""
    logdir = tmp_path / "logs"
    logdir.mkdir()
    log = write_log(logdir / "vllm.log", SEED)
    before = snapshot(logdir)
    inv = _inventory(tmp_path / "inv.yaml", sshd, str(log))
    if channel in ("inventory-log", "run_start"):
        hosts = {
            f"gpu{i:02d}": {"log": str(logdir / v)}
            if channel == "inventory-log"
            else {"log": str(log), "funnel": {"run_start": v}}
            for i, v in enumerate(CORE)
        }
        accepted = {}
        for name, host in hosts.items():  # the inventory's own judgement of each value, no host reached
            r = CliRunner().invoke(
                main, ["-i", str(inventory_file(tmp_path / "one.yaml", {name: host}, sshd)), "check"]
            )
            assert r.exit_code in (0, 2) and "MarkupError" not in r.output, (host, r.exit_code, r.output)
            if r.exit_code == 0:
                accepted[name] = host
            else:  # refused: so is the probe, before any host is reached
                assert _cli(sshd, tmp_path / "one.yaml", "probe", "all", "--json").exit_code == 2
        assert len(accepted) >= len(CORE) - 2, accepted  # the newline values may be refused, the rest run
        r = _cli(sshd, inventory_file(tmp_path / "all.yaml", accepted, sshd), "probe", "all", "--json")
        verdicts = {h["host"]: h["verdict"] for h in json.loads(r.output)["hosts"]}
        want = "no-log" if channel == "inventory-log" else "failed"  # a hostile name looked up literally
        assert r.exit_code == (3 if channel == "inventory-log" else 1) and set(verdicts.values()) == {want}, r.output
        assert sorted(verdicts) == sorted(accepted)
    for v in CORE if channel not in ("inventory-log", "run_start") else ():
        if channel == "--log":
            r = _cli(sshd, inv, "probe", "gpu01", "--json", "--log", str(logdir / v))
            ok = (2, 3)
        elif channel == "rules":
            rules = tmp_path / "rules.yaml"
            rules.write_text(json.dumps({"version": 1, "keywords": [v], "run_start": [v], "tags": [v]}))
            r = _cli(sshd, inv, "probe", "gpu01", extra=("--rules", str(rules)))
            ok = (1, 2)  # a bad rules file is a usage error (2), never a crash (4)
        else:  # a selector never reaches a shell at all, nor rich's markup ("[/bold]")
            r = _cli(sshd, inv, "probe", v, "--json")
            ok = (2,)
        assert r.exit_code in ok and "MarkupError" not in r.output, (v, r.exit_code, r.output)
    assert_no_canary(logdir, tmp_path)
    assert snapshot(logdir) == before


def test_hostile_address_user_and_jump_reach_no_shell(sshd, tmp_path, monkeypatch):
    """Connection parameters go to asyncssh as data (no ProxyCommand, no shell): the worst they do is fail."""
    real = socket.getaddrinfo

    def resolver(host, *a, **kw):  # no DNS traffic from this sandbox: every name is unknown
        if host in ("127.0.0.1", "::1", "localhost", None):
            return real(host, *a, **kw)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    log = write_log(tmp_path / "vllm.log", SEED)
    for v in CORE:
        for h in (
            Host(name="a", address=v, port=sshd.port, logs={"vllm": str(log)}),
            Host(name="u", address="127.0.0.1", port=sshd.port, user=v, logs={"vllm": str(log)}),
            Host(name="j", address="127.0.0.1", port=sshd.port, jump=v, logs={"vllm": str(log)}),
        ):
            res = run(probe_host(h, ProbeSettings(transport=sshd.opts(connect_timeout=3), rules=RULES)))
            assert res.verdict == "unreachable", (h, res)
    assert_no_canary(tmp_path)


# ============================================================================ the remote is never written


def test_remote_filesystem_unchanged_after_a_probe(tmp_path):
    """Remote HOME, cwd and TMPDIR are watched dirs; bash as the login shell (it would put here-documents in TMPDIR)."""
    home, cwd, tmpdir, logdir = (tmp_path / n for n in ("home", "cwd", "tmpdir", "logs"))
    for d in (home, cwd, tmpdir, logdir):
        d.mkdir()
    log = write_log(logdir / "vllm.log", SEED)
    (home / ".profile").write_text("# untouched\n")
    before = snapshot(home, cwd, tmpdir, logdir)
    atime = log.stat().st_atime_ns
    b = Behaviour(
        argv=["bash", "-c"] if shutil.which("bash") else ["/bin/sh", "-c"],
        cwd=str(cwd),
        env={"HOME": str(home), "TMPDIR": str(tmpdir)},
    )

    async def go():
        async with FaultServer(tmp_path / "srv", b) as srv:
            return await probe_host(make_host(srv.port, log), ProbeSettings(transport=srv.opts(), rules=RULES))

    res = run(go())
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    assert snapshot(home, cwd, tmpdir, logdir) == before
    assert log.stat().st_atime_ns >= atime  # read, yes; written, no


def test_remote_command_makes_no_write_syscall(tmp_path, strace):
    """The whole exec (funnel + facts) traced: every file opened for writing is /dev/null,
    and nothing is created, renamed, linked, removed or truncated."""
    log = write_log(tmp_path / "vllm.log", SEED)
    trace = tmp_path / "trace.txt"
    calls = (
        "open,openat,openat2,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,link,linkat,"
        "symlink,symlinkat,truncate,ftruncate,mknod,mknodat,chmod,fchmod,fchmodat,chown,fchown,fchownat,utimensat"
    )
    b = Behaviour(argv=["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", str(trace), "/bin/sh", "-c"])

    async def go():
        async with FaultServer(tmp_path / "srv", b) as srv:
            return await probe_host(make_host(srv.port, log), ProbeSettings(transport=srv.opts(), rules=RULES))

    res = run(go())
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    lines = trace.read_text().splitlines()
    assert any("openat(" in ln and str(log) in ln for ln in lines), "strace saw nothing: not traced?"
    bad = []
    for ln in lines:
        m = re.search(r"\b(\w+)\((.*)", ln)
        if not m or "= -1" in ln or "resumed>" in ln:
            continue
        name, args = m.groups()
        if name in ("open", "openat", "openat2", "creat"):
            if name == "creat" or re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND", args):
                if '"/dev/null"' not in args:
                    bad.append(ln)
        else:
            bad.append(ln)
    assert not bad, "the remote command wrote:\n" + "\n".join(bad[:20])


def test_script_redirects_only_to_dev_null():
    """A lint of the fixed script body: every redirection goes to /dev/null or another fd."""
    body = funnel_mod._BODY + funnel_mod._END
    body = re.sub(r"'[^']*'", "''", body)  # awk programs are quoted: their > is a comparison
    body = re.sub(r'"[^"]*"', '""', body)  # so are messages
    for m in re.finditer(r"(?<![<>&|0-9])(\d?>>?)\s*([^\s;|&)]+)", body):
        target = m.group(2)
        assert target == "/dev/null" or target.startswith("&"), f"the script writes to {target!r}: {m.group(0)}"
    assert "mktemp" not in body and "tee " not in body


# ============================================================================ nice, ionice, timeout


def _remote_meta(conn, spec) -> funnel_mod.FunnelResult:
    async def go():
        mark = funnel_mod.new_mark()
        out, *_ = await conn.run(funnel_mod.remote_command(funnel_mod.build_script(spec, mark)), 30)
        return funnel_mod.parse_output(out.decode(), mark)

    return go()


def test_remote_script_runs_niced_and_idle_io(sshd, tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)

    async def go():
        conn = await connect("127.0.0.1", sshd.port, sshd.user, sshd.opts())
        try:
            return await _remote_meta(conn, spec_for(str(log), RULES))
        finally:
            conn.close()

    fr = run(go())
    remote = fr.facts["remote"]
    assert remote["nice"] == "19"
    assert remote["ioclass"] == "idle"
    assert "timeout" in remote["tools"].split() and "ionice" in remote["tools"].split()


def test_remote_time_limit_cuts_a_stuck_pass(tmp_path):
    """A grep that never ends (a stuck disk) is stopped by the remote `timeout`, and the card says so."""
    log = write_log(tmp_path / "vllm.log", SEED)
    grep = shutil.which("grep")
    box = toolbox(
        tmp_path / "box",
        shims={
            "grep": f"""n=0; for a in "$@"; do [ "$a" = -e ] && n=$((n + 1)); done
[ $n -ge 2 ] && exec sleep 60
exec {grep} "$@"
"""
        },
    )

    async def go():
        async with FaultServer(tmp_path / "srv", Behaviour(env={"PATH": str(box)})) as srv:
            h = make_host(srv.port, log, funnel={"timeout": 1})
            t0 = asyncio.get_running_loop().time()
            res = await probe_host(h, ProbeSettings(transport=srv.opts(command_timeout=20), rules=RULES))
            return res, asyncio.get_running_loop().time() - t0

    res, took = run(go())
    assert took < 10, took  # not the 60 s of the stuck grep, nor the 20 s command timeout
    assert any("keyword pass: stopped by the 1s remote time limit" in m for m in res.markers), res.markers


# ============================================================================ --redact


SECRET_LOG = (
    b"INFO 05-09 15:14:00 [api_server.py:1] vLLM API server version 0.9.0\n"
    b"(Worker pid=9001) ERROR 05-09 15:16:00 [client.py:12] Traceback (most recent call last):\n"
    b'(Worker pid=9001) ERROR 05-09 15:16:00 [client.py:12]   File "/home/alice/venv/lib/python3.12/site-packages/x.py", line 3, in dial\n'
    b"(Worker pid=9001) ERROR 05-09 15:16:00 [client.py:12] ConnectionRefusedError: [Errno 111] Connect call failed "
    b"('10.20.30.40', 29500) on gpu-prod-17.cluster.internal with HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyzABCDEF "
    b"Authorization: Bearer sk-proj-abcdefghijklmnopqrstuvwxyz0123 user alice@gpu-prod-17 fe80::1ff:fe23:4567:890a\n"
)
SENSITIVE = (
    "10.20.30.40",
    "alice",
    "gpu-prod-17",
    "hf_abcdefghijklmnopqrstuvwxyzABCDEF",
    "sk-proj-abcdefghijklmnopqrstuvwxyz0123",
    "fe80::1ff:fe23:4567:890a",
    "198.51.100.23",
    "prod-bastion",
)


def test_redact_text_replaces_each_kind():
    r = Redactor(hosts=["gpu-prod-17"], users=["alice"], local=False)
    text = SECRET_LOG.decode().splitlines()[-1]
    out = r.text(text)
    for s in SENSITIVE[:6]:
        assert s not in out, (s, out)
    assert "ip-1" in out and "host-" in out and "user-1" in out and "<redacted>" in out
    assert "ConnectionRefusedError: [Errno 111] Connect call failed" in out  # the error itself stays readable
    # consistent within one redactor, and what identifies nothing stays
    assert r.text("10.20.30.40 again") == "ip-1 again"
    keep = "See root cause above. (Worker pid=7506) rank 3 at 127.0.0.1:8000 /root/x.py 15:15:08 max_num_batched_tokens=8192"
    assert r.text(keep) == keep
    for s, kind in (
        ("api_key=abcd1234efgh", "<redacted>"),
        ("--hf-token hf_x1y2z3a4b5c6d7e8f9g0h1i2", "<redacted>"),
        ("https://bob:pa55word@example.internal/x", "<redacted>"),
        ("ghp_" + "a1B2" * 9, "<redacted>"),
        ("AKIAIOSFODNN7EXAMPLE", "<redacted>"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "<redacted>"),
    ):
        assert kind in r.text(s) and s not in r.text(s), s


def test_redact_result_covers_every_field(tmp_path):
    from fleetdiag.records import Decisive

    res = HostResult(
        host="gpu-prod-17",
        verdict=FAILED,
        address="198.51.100.23",
        log="/home/alice/vllm.log",
        error=None,
        markers=["note from 10.20.30.40"],
        facts={"hostname": "gpu-prod-17"},
        decisive=Decisive(
            line=SECRET_LOG.decode().splitlines()[-1],
            message="m alice",
            traceback=['File "/home/alice/x.py"', "token=hf_abcdefghijklmnopqrstuvwxyzABCDEF"],
            fingerprint="abc123",
            hint="check 10.20.30.40",
        ),
    )
    out = redact_result(res, Redactor(local=False))
    dumped = json.dumps(out.to_json())
    for s in SENSITIVE:
        assert s not in dumped, s
    assert out.verdict == FAILED and out.decisive.fingerprint == "abc123"
    assert res.host == "gpu-prod-17"  # the original is untouched
    assert redact_text("nothing to hide") == "nothing to hide"


def _redact_inventory(tmp_path: Path, sshd, log: Path) -> Path:
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "hosts:\n"
        "  gpu-prod-17:\n"
        "    address: 127.0.0.1\n"
        f"    port: {sshd.port}\n"
        f"    user: {sshd.user}\n"
        f"    logs: {{vllm: {log}}}\n"
        "  gpu-prod-18:\n"
        "    address: 198.51.100.23\n"
        "    port: 1\n"
        "    jump: prod-bastion\n"
        f"    logs: {{vllm: {log}}}\n"
    )
    return inv


def test_redact_every_output_format(sshd, tmp_path):
    log = write_log(tmp_path / "vllm.log", SECRET_LOG)
    inv = _redact_inventory(tmp_path, sshd, log)
    outputs = {}
    for fmt in ("card", "json", "jsonl"):
        args = ["probe", "gpu-prod-17", "--all-cards"] + ([f"--{fmt}"] if fmt != "card" else [])
        r = _cli(sshd, inv, *args, extra=("--redact",))
        assert r.exit_code == 1, r.output
        outputs[fmt] = r.output
        plain = _cli(sshd, inv, *args)
        assert "gpu-prod-17" in plain.output  # without --redact it is all there
    doc = json.loads(outputs["json"])
    assert doc["hosts"][0]["host"] == "host-1" and doc["hosts"][0]["verdict"] == FAILED
    # analyze (local file) too
    r = CliRunner().invoke(main, ["--redact", "analyze", str(log), "--json"])
    outputs["analyze"] = r.output
    # sweep: the report file and the printed news are redacted; the history keeps real names
    report, db = tmp_path / "report.json", tmp_path / "history.db"
    r = CliRunner().invoke(
        main,
        [
            "--redact",
            "-i",
            str(inv),
            "sweep",
            "all",
            "--db",
            str(db),
            "--report",
            str(report),
            *sshd.cli_args(),
            "--connect-timeout",
            "2",
        ],
    )
    assert r.exit_code == 1, r.output
    outputs["sweep"] = r.output
    outputs["report"] = report.read_text()
    assert json.loads(outputs["report"])["hosts"][0]["host"] == "host-1"
    for name, text in outputs.items():
        for s in SENSITIVE:
            assert s not in text, f"{s!r} leaked in {name}:\n{text}"
    assert "ip-" in outputs["card"] and "<redacted>" in outputs["json"]
    # the local history keeps the real names, so incidents keep matching across redacted and plain sweeps
    con = sqlite3.connect(db)
    try:
        assert "gpu-prod-17" in con.execute("select group_concat(host) from incidents").fetchone()[0]
    finally:
        con.close()


# ============================================================================ secrets


PASSPHRASE = "correct-horse-" + uuid.uuid4().hex[:8]


def test_passphrase_never_printed_nor_stored(tmp_path, monkeypatch):
    """An encrypted key unlocked by $FLEETDIAG_PASSPHRASE: not in any output, error, report or history."""
    log = write_log(tmp_path / "vllm.log", SEED)
    assert PASSPHRASE not in repr(TransportOptions(passphrase=PASSPHRASE))
    with ServerThread(tmp_path / "srv", client_passphrase=PASSPHRASE) as srv:
        inv = tmp_path / "inv.yaml"
        inv.write_text(
            f"hosts:\n  gpu01:\n    address: 127.0.0.1\n    port: {srv.port}\n    user: root\n"
            f"    logs: {{vllm: {log}}}\n"
        )
        base = ["-i", str(inv)]
        tr = ["--known-hosts", str(srv.known_hosts), "--identity", str(srv.client_key_path), "--ssh-config", os.devnull]
        seen: list[str] = []
        monkeypatch.setenv("FLEETDIAG_PASSPHRASE", PASSPHRASE)
        for args in (["probe", "gpu01"], ["probe", "gpu01", "--json"], ["probe", "gpu01", "--jsonl"]):
            r = CliRunner().invoke(main, base + args + tr)
            assert r.exit_code == 1, r.output  # the key was unlocked: the failure was found
            seen.append(r.output)
        report, db = tmp_path / "report.json", tmp_path / "history.db"
        r = CliRunner().invoke(main, base + ["sweep", "all", "--db", str(db), "--report", str(report)] + tr)
        assert r.exit_code == 1, r.output
        seen += [r.output, report.read_text()]
        # the wrong passphrase: a plain error, without either phrase in it
        monkeypatch.setenv("FLEETDIAG_PASSPHRASE", PASSPHRASE + "-wrong")
        r = CliRunner().invoke(main, base + ["probe", "gpu01", "--json"] + tr)
        assert r.exit_code == 3 and "cannot load a client key" in r.output, r.output
        seen.append(r.output)
        r = CliRunner().invoke(main, base + ["sweep", "all", "--db", str(db), "--report", str(report)] + tr)
        seen += [r.output, report.read_text()]
    for text in seen:
        assert PASSPHRASE not in text
    for path in [db, *db.parent.glob(db.name + "*")]:
        assert PASSPHRASE.encode() not in path.read_bytes(), path


def test_markup_in_remote_content_is_shown_as_text(sshd, tmp_path):
    """Log lines, paths and process tags are data: rich markup in them neither styles nor crashes a card."""
    logdir = tmp_path / "[red]logs"
    logdir.mkdir()
    log = write_log(logdir / "vllm [bold].log", SEED.replace(b"out of bounds", b"out of [/bold][red]bounds[/red]"))
    inv = _inventory(tmp_path / "inv.yaml", sshd, str(log))
    r = _cli(sshd, inv, "probe", "gpu01", extra=("--no-color",))
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output  # no MarkupError
    assert "[/bold][red]bounds[/red]" in r.output  # shown as written, not as styles


def test_passwords_in_the_inventory_are_never_echoed(tmp_path):
    """fleetdiag takes no password from an inventory: a native `password:` is an unknown-key error
    that names the key, not the value; Ansible's password variables are ignored, never shown."""
    from .sshd import free_port

    secret = "hunter2-" + uuid.uuid4().hex[:8]
    native = tmp_path / "native.yaml"
    native.write_text(f"hosts:\n  gpu01:\n    address: 127.0.0.1\n    password: {secret}\n    logs: {{v: /x.log}}\n")
    r = CliRunner().invoke(main, ["-i", str(native), "check"])
    assert r.exit_code == 2 and "unknown key 'password'" in r.output and secret not in r.output
    ansible = tmp_path / "ansible.yaml"
    ansible.write_text(
        f"all:\n  vars:\n    ansible_password: {secret}\n    ansible_become_pass: {secret}\n"
        f"  hosts:\n    gpu01:\n      ansible_host: 127.0.0.1\n      ansible_port: {free_port()}\n"
        f"      ansible_ssh_pass: {secret}\n      fleetdiag_logs: {{v: /x.log}}\n"
    )
    for args in (["check"], ["hosts", "--json"], ["hosts"], ["probe", "gpu01", "--json"], ["probe", "gpu01"]):
        r = CliRunner().invoke(
            main, ["-i", str(ansible), *args, *(["--known-hosts", os.devnull] if args[0] == "probe" else [])]
        )
        assert r.exit_code in (0, 3), r.output
        assert secret not in r.output
