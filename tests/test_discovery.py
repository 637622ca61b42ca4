"""Where the log is: discovery from the job's process, journal/docker/command sources, ad hoc hosts.

Real parts: a real sshd, a real process started as a user starts vLLM (its stdout a file),
real ``journalctl`` over a real journal file written by ``systemd-journal-remote``, and
real cgroups where this machine lets the test make one. Stand-ins, where no daemon can
run here: ``docker`` (a script honouring ``docker logs --tail N CONTAINER``) and the
``journalctl`` on the node's PATH, which is a wrapper adding ``--file=`` to the real one.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.analysis import load_rules
from fleetdiag.cli import main
from fleetdiag.inventory import InventoryError, LogSource, parse_inventory
from fleetdiag.inventory.adhoc import parse_target
from fleetdiag.probe import ProbeSettings, apply_source, finish, probe_host, spec_for
from fleetdiag.records import FAILED, NO_LOG
from fleetdiag.remote import funnel
from fleetdiag.render import host_card, source_text

CORPUS = Path("/work/shared/corpus/dev")
LOCAL_CORPUS = Path(__file__).resolve().parent / "corpus"
CASE = "vllm_27508_sampler_warmup_oom"
DECISIVE = "CUDA out of memory occurred when warming up sampler"
RULES = load_rules()
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"


def case_log() -> str:
    for d in (CORPUS, LOCAL_CORPUS):
        p = d / f"{CASE}.log"
        if p.exists():
            return p.read_text()
    pytest.fail(f"corpus case {CASE} missing")


def run(coro):
    return asyncio.run(coro)


def host_entry(sshd, name: str, extra: str = "") -> str:
    return f"  {name}:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n{extra}"


def probe(sshd, inv_text: str, name: str, **settings):
    inv = parse_inventory(inv_text, "disc.yaml")
    return run(probe_host(inv.hosts[name], ProbeSettings(transport=sshd.opts(), **settings)))


def card_text(res) -> str:
    from rich.console import Console

    with open(os.devnull, "w") as sink:
        con = Console(width=200, record=True, file=sink)
        con.print(host_card(res))
        return con.export_text()


@pytest.fixture
def vllm_job(tmp_path_factory):
    """A stand-in ``vllm`` console script started as a user would: ``vllm serve ... > log 2>&1``.
    It prints a real vLLM failure and sleeps, like a server whose engine died."""
    work = tmp_path_factory.mktemp("job")
    src = work / "case.log"
    src.write_text(case_log())
    exe = work / "vllm"
    exe.write_text(
        f"#!{sys.executable}\nimport sys, time\nsys.stdout.write(open({str(src)!r}).read())\n"
        "sys.stdout.flush()\ntime.sleep(600)\n"
    )
    exe.chmod(0o755)
    proc = subprocess.Popen(
        ["sh", "-c", "exec ./vllm serve facebook/opt-125m > some.log 2>&1"], cwd=work, start_new_session=True
    )
    log = work / "some.log"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and DECISIVE not in (log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    yield proc, log
    proc.kill()
    proc.wait()


# --------------------------------------------------------------------------- discovery through /proc


def test_host_without_logs_finds_vllm_stdout_through_proc(sshd, vllm_job):
    proc, log = vllm_job
    res = probe(sshd, "hosts:\n" + host_entry(sshd, "gpu01"), "gpu01")
    assert res.verdict == FAILED, (res.error, res.markers)
    assert DECISIVE in res.decisive.line
    assert res.log == str(log)
    assert res.log_source == {
        "kind": "file",
        "detail": str(log),
        "found_by": f"stdout and stderr of pid {proc.pid} (vllm serve)",
    }
    assert res.timing.round_trips == 1
    text = card_text(res)
    assert f"stdout and stderr of pid {proc.pid} (vllm serve) → {log}" in " ".join(text.split())
    assert res.to_json()["log_source"]["kind"] == "file"


def test_missing_named_log_falls_back_to_the_running_job(sshd, vllm_job, tmp_path):
    _proc, log = vllm_job
    gone = tmp_path / "not-there.log"
    res = probe(sshd, "hosts:\n" + host_entry(sshd, "gpu02", f"    logs: {gone}\n"), "gpu02")
    assert res.verdict == FAILED, res.error
    assert DECISIVE in res.decisive.line
    assert res.log == str(log)
    assert any(f"configured log {gone} does not exist" in m for m in res.markers)


def test_no_job_no_logs_is_no_log_after_connecting(tmp_path):
    """No framework process and nothing configured: the host says so (it was reached)."""
    spec = spec_for("", RULES)
    apply_source(spec, LogSource("discover"), None, None)
    spec.extra_vars["FD_JOBS"] = "^no-such-job-name$"  # this machine may run other python -m tools
    spec.extra_vars["FD_JOBMODS"] = "^no-such-module$"
    spec.extra_vars["FD_NOTJOBS"] = ".*"
    fr = funnel.run_local(spec, timeout=60)
    res = finish("h", fr, RULES)
    assert res.verdict == NO_LOG
    assert fr.status == "no-source"
    assert "no job process found" in res.error


def test_dead_job_reads_the_newest_configured_log(tmp_path):
    old, new = tmp_path / "a" / "old.log", tmp_path / "b" / "new.log"
    for p in (old, new):
        p.parent.mkdir()
    old.write_text("INFO fine\n")
    new.write_text(case_log())
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    spec = spec_for("", RULES)
    spec.source, spec.globs = "discover", [str(tmp_path / "a" / "*.log"), str(tmp_path / "b" / "*.log")]
    spec.extra_vars.update(FD_JOBS="^no-such-job-name$", FD_JOBMODS="^no-such-module$", FD_NOTJOBS=".*")
    fr = funnel.run_local(spec, timeout=60)
    assert fr.path == str(new)
    assert fr.facts["log_source"]["found_by"].startswith("no job process running")
    assert DECISIVE in finish("h", fr, RULES).decisive.line


def test_fleetdiag_own_remote_processes_are_never_the_job(tmp_path):
    """A process whose command line carries fleetdiag-remote is skipped even when it looks like vllm."""
    fake = subprocess.Popen(["sh", "-c", "sleep 30", "fleetdiag-remote", "vllm", "serve"], start_new_session=True)
    try:
        spec = spec_for("", RULES)
        spec.source = "discover"
        spec.extra_vars.update(FD_JOBS="^(sh|vllm)$", FD_JOBMODS="^no-such-module$", FD_NOTJOBS=".*")
        fr = funnel.run_local(spec, timeout=60)
        assert str(fake.pid) not in json.dumps(fr.facts.get("log_source") or {})
    finally:
        fake.kill()
        fake.wait()


# --------------------------------------------------------------------------- journald


def write_journal(tmp_path: Path, unit: str, text: str) -> Path:
    """A real journal file: export format through systemd-journal-remote."""
    if not os.path.exists(JOURNAL_REMOTE):
        pytest.fail("systemd-journal-remote missing: apt-get install systemd-journal-remote")
    export = bytearray()
    t0 = int(time.time() * 1e6)
    for i, line in enumerate(text.splitlines()):
        export += (
            f"__REALTIME_TIMESTAMP={t0 + i}\n__MONOTONIC_TIMESTAMP={i + 1}\n"
            f"_BOOT_ID=0123456789abcdef0123456789abcdef\n_SYSTEMD_UNIT={unit}\n"
            f"SYSLOG_IDENTIFIER=vllm\nMESSAGE={line}\n\n"
        ).encode()
    out = tmp_path / "journal" / "remote.journal"
    out.parent.mkdir()
    subprocess.run([JOURNAL_REMOTE, f"--output={out}", "-"], input=bytes(export), check=True, capture_output=True)
    return out


def journal_path_dir(tmp_path: Path, journal: Path) -> Path:
    """The node's journalctl: the real one, reading the test's journal file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    real = shutil.which("journalctl", path="/usr/bin:/bin")
    (bin_dir / "journalctl").write_text(f'#!/bin/sh\nexec {real} --file={journal} "$@"\n')
    (bin_dir / "journalctl").chmod(0o755)
    return bin_dir


def test_journal_source_reads_real_journalctl(sshd, tmp_path):
    journal = write_journal(tmp_path, "vllm.service", "INFO other unit noise\n" + case_log())
    bin_dir = journal_path_dir(tmp_path, journal)
    inv = "hosts:\n" + host_entry(sshd, "gpu03", "    logs:\n      serve: {journal: vllm.service}\n")
    res = probe(sshd, inv, "gpu03", path_prepend=str(bin_dir))
    assert res.verdict == FAILED, (res.error, res.markers)
    assert DECISIVE in res.decisive.line
    assert res.log_source == {"kind": "journal", "detail": "vllm.service", "found_by": "the inventory (logs.serve)"}
    assert res.log == "journalctl -u vllm.service"
    # another unit has nothing: said plainly, not healthy
    inv2 = "hosts:\n" + host_entry(sshd, "gpu03", "    logs:\n      serve: {journal: other.service}\n")
    res2 = probe(sshd, inv2, "gpu03", path_prepend=str(bin_dir))
    assert res2.verdict == NO_LOG and "log is empty" in res2.error


def cgroup_dir(name: str) -> Path | None:
    base = Path("/sys/fs/cgroup/systemd")
    if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
        return None
    return base / name


def in_cgroup(cg: Path, argv: list[str], cwd: Path) -> subprocess.Popen:
    cg.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def rm_cgroup(cg: Path) -> None:
    for d in (cg, cg.parent):
        try:
            d.rmdir()
        except OSError:
            pass


@pytest.mark.skipif(cgroup_dir("x") is None, reason="needs a writable cgroup hierarchy (root on Linux)")
def test_discovery_follows_a_systemd_unit_to_the_journal(sshd, tmp_path):
    """A vllm whose stdout is a pipe (as under systemd), in cgroup system.slice/fdtest-vllm.service."""
    journal = write_journal(tmp_path, "fdtest-vllm.service", case_log())
    bin_dir = journal_path_dir(tmp_path, journal)
    cg = cgroup_dir("system.slice/fdtest-vllm.service")
    exe = tmp_path / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    exe.chmod(0o755)
    proc = in_cgroup(cg, [str(exe), "serve", "m"], tmp_path)
    try:
        time.sleep(0.5)
        res = probe(sshd, "hosts:\n" + host_entry(sshd, "gpu04"), "gpu04", path_prepend=str(bin_dir))
        assert res.verdict == FAILED, (res.error, res.markers)
        assert DECISIVE in res.decisive.line
        assert res.log_source["kind"] == "journal"
        assert res.log_source["detail"] == "fdtest-vllm.service"
        assert f"pid {proc.pid} (vllm serve) runs in systemd unit fdtest-vllm.service" in res.log_source["found_by"]
    finally:
        proc.kill()
        proc.wait()
        rm_cgroup(cg)


# --------------------------------------------------------------------------- docker


def docker_standin(bin_dir: Path, logs: dict[str, Path], refuse: bool = False) -> None:
    """`docker logs --tail N CONTAINER`: the container's last N lines, stdout; unknown: exit 1.
    With ``refuse``, every call fails as a user outside the docker group does."""
    bin_dir.mkdir(exist_ok=True)
    cases = "\n".join(f"  {k}) f={v} ;;" for k, v in logs.items())
    body = f"""#!/bin/sh
{"echo 'permission denied while trying to connect to the Docker daemon socket' >&2; exit 1" if refuse else ""}
[ "$1" = logs ] || {{ echo "stand-in docker: only 'logs' is implemented" >&2; exit 2; }}
shift; n=all
while [ $# -gt 1 ]; do case $1 in --tail) n=$2; shift 2 ;; *) echo "unknown flag $1" >&2; exit 2 ;; esac; done
case $1 in
{cases}
  *) echo "Error: No such container: $1" >&2; exit 1 ;;
esac
if [ "$n" = all ]; then cat "$f"; elif [ "$n" -eq 0 ]; then :; else tail -n "$n" "$f"; fi
"""
    (bin_dir / "docker").write_text(body)
    (bin_dir / "docker").chmod(0o755)


def test_docker_source_through_docker_logs(sshd, tmp_path):
    src = tmp_path / "c.log"
    src.write_text(case_log())
    docker_standin(tmp_path / "bin", {"vllm-server": src})
    inv = "hosts:\n" + host_entry(sshd, "gpu05", "    logs:\n      serve: {docker: vllm-server}\n")
    res = probe(sshd, inv, "gpu05", path_prepend=str(tmp_path / "bin"))
    assert res.verdict == FAILED, (res.error, res.markers)
    assert DECISIVE in res.decisive.line
    assert res.log_source["kind"] == "docker"
    inv = "hosts:\n" + host_entry(sshd, "gpu05", "    logs:\n      serve: {docker: no-such}\n")
    res = probe(sshd, inv, "gpu05", path_prepend=str(tmp_path / "bin"))
    assert res.verdict == NO_LOG and "not permitted" in res.error


def json_file_log(text: str) -> str:
    """Docker's json-file format: one compact JSON object per line, the text with its newline in
    "log" (raw UTF-8 as Go writes it; every other line \\u-escaped, which Go does for <, > and &)."""
    out = []
    for i, line in enumerate(text.splitlines(keepends=True)):
        out.append(
            json.dumps(
                {"log": line, "stream": "stderr" if i % 2 else "stdout", "time": "2025-10-25T13:12:42.000000000Z"},
                separators=(",", ":"),
                ensure_ascii=bool(i % 2),
            )
        )
    return "\n".join(out) + "\n"


def test_docker_json_file_read_when_docker_logs_is_refused(tmp_path):
    cid = "ab" * 32
    root = tmp_path / "docker"
    (root / "containers" / cid).mkdir(parents=True)
    text = case_log() + 'unicode: \u00e9\u4e2d "quoted" back\\slash\ttab\n' + "<tag> & \u00e9\u4e2d\n"
    (root / "containers" / cid / f"{cid}-json.log").write_text(json_file_log(text))
    docker_standin(tmp_path / "bin", {}, refuse=True)
    spec = spec_for("", RULES)
    apply_source(spec, LogSource("docker", cid[:12]), None, str(tmp_path / "bin"))
    spec.docker_root = str(root)
    fr = funnel.run_local(spec, timeout=60)
    assert fr.status == "ok", fr.facts
    assert any("json-file" in m for m in fr.markers)
    texts = [ln.text for ln in fr.lines()]
    assert 'unicode: \u00e9\u4e2d "quoted" back\\slash\ttab' in texts
    assert "<tag> & \u00e9\u4e2d" in texts
    assert DECISIVE in finish("h", fr, RULES).decisive.line
    assert fr.mtime is not None  # the json-file's mtime: idle time works for it


# --------------------------------------------------------------------------- command


def test_command_source_runs_as_written(sshd, tmp_path):
    odd = tmp_path / "it's $HOME; `x`.log"
    odd.write_text(case_log())
    cmd = "cat " + "'" + str(odd).replace("'", "'\\''") + "'"
    inv = "hosts:\n" + host_entry(sshd, "gpu06", f"    logs:\n      k8s: {{command: {json.dumps(cmd)}}}\n")
    res = probe(sshd, inv, "gpu06")
    assert res.verdict == FAILED, (res.error, res.markers)
    assert DECISIVE in res.decisive.line
    assert res.log_source == {"kind": "command", "detail": cmd, "found_by": "the inventory (logs.k8s)"}
    assert "stdout of `cat" in source_text(res.log_source)


# --------------------------------------------------------------------------- inventory values


def test_source_values_are_validated_with_file_line_key():
    text = (
        "hosts:\n  a:\n    logs:\n      s: {journal: '-x'}\n      d: {docker: 'a;b'}\n"
        "      c: {command: ''}\n      t: {jurnal: x}\n      two: {docker: a, journal: b}\n"
    )
    with pytest.raises(InventoryError) as e:
        parse_inventory(text, "inv.yaml")
    msgs = [str(x) for x in e.value.errors]
    assert any(m.startswith("inv.yaml:4: hosts.a.logs.s.journal: '-x' is not a systemd unit") for m in msgs)
    assert any(m.startswith("inv.yaml:5: hosts.a.logs.d.docker:") for m in msgs)
    assert any(m.startswith("inv.yaml:6: hosts.a.logs.c.command: expected a non-empty string") for m in msgs)
    assert any("hosts.a.logs.t.jurnal: unknown key 'jurnal' (did you mean 'journal'?)" in m for m in msgs)
    assert any("hosts.a.logs.two: a log source has exactly one of the keys" in m for m in msgs)


def test_host_without_logs_discovers_and_watch_gets_a_clear_error():
    inv = parse_inventory("hosts:\n  a: {}\n  b:\n    logs:\n      j: {journal: x.service}\n", "i.yaml")
    assert inv.hosts["a"].log_source() == ("discover", LogSource("discover"))
    with pytest.raises(InventoryError, match="is a journal stream"):
        inv.hosts["b"].log_path()


# --------------------------------------------------------------------------- ad hoc


@pytest.mark.parametrize(
    "text,want",
    [
        ("gpu01", (None, None, None)),
        ("alice@gpu01:2222", ("gpu01", 2222, "alice")),
        ("10.0.0.5:22", ("10.0.0.5", 22, None)),
        ("bob@[fe80::1]:2200", ("fe80::1", 2200, "bob")),
    ],
)
def test_adhoc_targets(text, want):
    h = parse_target(text)
    assert (h.address, h.port, h.user) == want
    assert h.name == text


@pytest.mark.parametrize("text", ["-oProxyCommand=x", "gpu01:99999", "a;b@host", "host$(x)", "[fe80::1"])
def test_adhoc_targets_refused(text):
    with pytest.raises(InventoryError):
        parse_target(text)


def isolated_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local"),
        "XDG_STATE_HOME": str(home / ".state"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "FLEETDIAG_INVENTORY": "",
        "FLEETDIAG_DB": str(home / "db.sqlite"),
    }
    return env


def test_adhoc_probe_with_no_inventory_anywhere(sshd, tmp_path, monkeypatch):
    log = tmp_path / "vllm.log"
    log.write_text(case_log())
    monkeypatch.chdir(tmp_path)
    for k, v in isolated_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("FLEETDIAG_INVENTORY")
    common = [
        "--json",
        *sshd.cli_args(),
    ]
    r = CliRunner().invoke(main, ["probe", f"{sshd.user}@127.0.0.1:{sshd.port}", "--log", str(log), *common])
    assert r.exit_code == 1, r.output
    host = json.loads(r.output)["hosts"][0]
    assert host["verdict"] == "failed" and DECISIVE in host["decisive"]["line"]
    assert host["log_source"] == {"kind": "file", "detail": str(log), "found_by": "--log"}
    # an ~/.ssh/config alias is a host too
    r = CliRunner().invoke(main, ["probe", "sshd-alias", "--log", str(log), *common])
    assert r.exit_code == 1, r.output
    assert json.loads(r.output)["hosts"][0]["verdict"] == "failed"
    # a value that is not a host is refused before anything connects
    r = CliRunner().invoke(main, ["probe", "gpu01;reboot", "--log", str(log), *common])
    assert r.exit_code != 0 and "not a host to probe" in r.output


# --------------------------------------------------------------------------- Slurm and the working directory


def piped_vllm(tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A vllm whose stdout is a pipe (as under srun or a supervisor), so /proc/PID/fd/1 is no file."""
    exe = tmp_path / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    exe.chmod(0o755)
    return subprocess.Popen(
        [str(exe), "serve", "m"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def test_slurm_job_stdout_from_scontrol(sshd, tmp_path):
    out = tmp_path / "spool" / "slurm-4242.out"
    out.parent.mkdir()
    out.write_text(case_log())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # stand-in scontrol: `scontrol show job ID`, one line of Key=Value words as the real one prints
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\n[ "$1 $2" = "show job" ] && [ "$3" = 4242 ] || { echo "slurm_load_jobs error: Invalid job id" >&2; exit 1; }\n'
        f'echo "JobId=4242 JobName=serve UserId=u(1000) JobState=RUNNING WorkDir={tmp_path} StdErr={out} StdIn=/dev/null StdOut={out}"\n'
    )
    (bin_dir / "scontrol").chmod(0o755)
    proc = piped_vllm(tmp_path, {"SLURM_JOB_ID": "4242"})
    try:
        time.sleep(0.3)
        res = probe(sshd, "hosts:\n" + host_entry(sshd, "gpu07"), "gpu07", path_prepend=str(bin_dir))
        assert res.verdict == FAILED, (res.error, res.markers)
        assert DECISIVE in res.decisive.line
        assert res.log_source == {
            "kind": "slurm",
            "detail": str(out),
            "found_by": f"pid {proc.pid} (vllm serve) is Slurm job 4242: its StdOut",
        }
    finally:
        proc.kill()
        proc.wait()


def test_newest_log_in_the_working_directory(sshd, tmp_path):
    (tmp_path / "old.log").write_text("INFO nothing\n")
    os.utime(tmp_path / "old.log", (time.time() - 600, time.time() - 600))
    (tmp_path / "server.log").write_text(case_log())
    proc = piped_vllm(tmp_path)
    try:
        time.sleep(0.3)
        res = probe(sshd, "hosts:\n" + host_entry(sshd, "gpu08"), "gpu08")
        assert res.verdict == FAILED, (res.error, res.markers)
        assert res.log == str(tmp_path / "server.log")
        assert res.log_source["found_by"] == f"newest *.log in the working directory of pid {proc.pid} (vllm serve)"
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- Ansible INI and --list JSON

ANSIBLE_INI = """# an Ansible INI inventory, as teams keep it
gpu00 ansible_host=10.0.0.9

[gpu]
gpu[01:03] ansible_user=ubuntu
uk-node ansible_host=127.0.0.1 ansible_port={port} ansible_user={user} ansible_ssh_private_key_file={key} rack=r7

[gpu:vars]
fleetdiag_logs={log}
ansible_become=true

[dc:children]
gpu
"""


def test_ansible_ini_inventory(tmp_path):
    inv = parse_inventory(ANSIBLE_INI.format(port=2222, user="alice", key="~/.ssh/uk.pem", log="/l/v.log"), "hosts.ini")
    assert list(inv.hosts) == ["gpu00", "gpu01", "gpu02", "gpu03", "uk-node"]
    uk = inv.hosts["uk-node"]
    assert (uk.address, uk.port, uk.user, uk.identity_file) == ("127.0.0.1", 2222, "alice", "~/.ssh/uk.pem")
    assert inv.hosts["gpu01"].user == "ubuntu" and inv.hosts["gpu01"].logs == {"default": "/l/v.log"}
    assert inv.hosts["gpu00"].address == "10.0.0.9" and inv.hosts["gpu00"].log_source()[0] == "discover"
    assert inv.groups["dc"] == ["gpu01", "gpu02", "gpu03", "uk-node"]
    assert any("hosts.ini:6: ignored vars fleetdiag does not use: rack" in w for w in inv.warnings)
    assert any("ansible_become noted: fleetdiag never escalates" in w for w in inv.warnings)


def test_ansible_ini_errors_are_located():
    with pytest.raises(InventoryError) as e:
        parse_inventory("[gpu]\nok-host\nbad;host ansible_port=22\n[gpu:weird]\n", "h.ini")
    msgs = [str(x) for x in e.value.errors]
    assert any(m.startswith("h.ini:3:") and "bad;host" in m for m in msgs), msgs
    assert any(m.startswith("h.ini:4:") and "unknown section kind" in m for m in msgs), msgs


def test_ansible_inventory_list_json():
    doc = {
        "_meta": {
            "hostvars": {
                "a1": {
                    "ansible_host": "10.0.0.1",
                    "ansible_port": 2200,
                    "ansible_ssh_private_key_file": "/k/a.pem",
                    "weird_var": 1,
                },
                "b1": {"ansible_user": "bob", "ansible_ssh_port": 2201},
            }
        },
        "all": {"children": ["ungrouped", "gpu"]},
        "gpu": {"hosts": ["a1"], "vars": {"fleetdiag_logs": {"serve": {"journal": "vllm.service"}}}},
        "ungrouped": {"hosts": ["b1"]},
    }
    inv = parse_inventory(json.dumps(doc, indent=1), "list.json")
    a1, b1 = inv.hosts["a1"], inv.hosts["b1"]
    assert (a1.address, a1.port, a1.identity_file) == ("10.0.0.1", 2200, "/k/a.pem")
    assert a1.log_source() == ("serve", LogSource("journal", "vllm.service"))
    assert (b1.user, b1.port) == ("bob", 2201)
    assert inv.groups == {"ungrouped": ["b1"], "gpu": ["a1"]}
    assert inv.warnings and "weird_var" in inv.warnings[0] and inv.warnings[0].startswith("list.json:")


def test_ansible_private_key_file_is_used_to_log_in(sshd, tmp_path):
    """`check` may pass with the default keys; the probe must log in with the inventory's key."""
    from .sshd import keygen

    log = tmp_path / "v.log"
    log.write_text(case_log())
    wrong = keygen(tmp_path / "wrong_ed25519")
    inv = parse_inventory(ANSIBLE_INI.format(port=sshd.port, user=sshd.user, key=sshd.client_key, log=log), "h.ini")
    settings = ProbeSettings(transport=sshd.opts(client_keys=[str(wrong)]))
    res = run(probe_host(inv.hosts["uk-node"], settings))
    assert res.verdict == FAILED, res.error
    inv.hosts["uk-node"].identity_file = None  # without it, the wrong key alone is refused
    res = run(probe_host(inv.hosts["uk-node"], ProbeSettings(transport=sshd.opts(client_keys=[str(wrong)]))))
    assert res.verdict == "unreachable"


def test_native_identity_file_key():
    inv = parse_inventory("hosts:\n  a:\n    identity_file: ~/.ssh/a.pem\n", "i.yaml")
    assert inv.hosts["a"].identity_file == "~/.ssh/a.pem"
    with pytest.raises(InventoryError, match="i.yaml:3: hosts.a.identity_file: expected the path"):
        parse_inventory("hosts:\n  a:\n    identity_file: 3\n", "i.yaml")


# --------------------------------------------------------------------------- read-only


WRITE_CALLS = (
    "open,openat,openat2,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,link,linkat,"
    "symlink,symlinkat,truncate,ftruncate,mknod,mknodat,chmod,fchmod,fchmodat,chown,fchown,fchownat,utimensat"
)


def test_discovery_and_streams_make_no_write_syscall(vllm_job, tmp_path, strace):
    """Discovery (through /proc) and a command stream, traced under bash (which would put a
    here-document in a temp file): every file opened for writing is /dev/null."""
    import re

    _proc, log = vllm_job
    for source in (LogSource("discover"), LogSource("command", f"cat {log}")):
        spec = spec_for("", RULES)
        apply_source(spec, source, None, None)
        trace = tmp_path / f"trace-{source.kind}.txt"
        script = funnel.build_script(spec, "@@FD:t")
        p = subprocess.run(
            ["strace", "-f", "-qq", "-e", f"trace={WRITE_CALLS}", "-o", str(trace), "bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        fr = funnel.parse_output(p.stdout, "@@FD:t")
        assert DECISIVE in finish("h", fr, RULES).decisive.line
        bad = []
        for ln in trace.read_text().splitlines():
            m = re.search(r"\b(\w+)\((.*)", ln)
            if not m or "= -1" in ln or "resumed>" in ln:
                continue
            name, args = m.groups()
            if name in ("open", "openat", "openat2", "creat"):
                if (
                    name == "creat" or re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND", args)
                ) and '"/dev/null"' not in args:
                    bad.append(ln)
            else:
                bad.append(ln)
        assert not bad, f"{source.kind} wrote:\n" + "\n".join(bad[:20])


def test_discover_script_redirects_only_to_dev_null():
    import re

    body = re.sub(r"'[^']*'", "''", funnel._SOURCE)
    body = re.sub(r'"[^"]*"', '""', body)
    for m in re.finditer(r"(?<![<>&|0-9])(\d?>>?)\s*([^\s;|&)]+)", body):
        assert m.group(2) == "/dev/null" or m.group(2).startswith("&"), m.group(0)
    assert "mktemp" not in body and "tee " not in body and "<<" not in body


def test_cli_names_unused_ansible_vars(tmp_path):
    inv = tmp_path / "hosts.ini"
    inv.write_text(ANSIBLE_INI.format(port=2222, user="alice", key="/k", log="/l/v.log"))
    r = CliRunner().invoke(main, ["-i", str(inv), "hosts"])
    assert r.exit_code == 0, r.output
    assert "warning: " in r.output and "ignored vars fleetdiag does not use: rack" in r.output
    assert "uk-node" in r.output


def test_stdout_and_stderr_in_two_files_reads_the_newer_and_names_the_other(tmp_path):
    exe = tmp_path / "vllm"
    exe.write_text(
        f"#!{sys.executable}\nimport sys, time\nprint('INFO starting', flush=True)\ntime.sleep(1.1)\n"
        f"sys.stderr.write(open({str(tmp_path / 'case.log')!r}).read()); sys.stderr.flush()\ntime.sleep(600)\n"
    )
    exe.chmod(0o755)
    (tmp_path / "case.log").write_text(case_log())
    proc = subprocess.Popen(
        ["sh", "-c", "exec ./vllm serve m > out.log 2> err.log"], cwd=tmp_path, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 20
        err = tmp_path / "err.log"
        while time.monotonic() < deadline and DECISIVE not in (err.read_text() if err.exists() else ""):
            time.sleep(0.05)
        spec = spec_for("", RULES)
        spec.source = "discover"
        fr = funnel.run_local(spec, timeout=60)
        assert fr.path == str(tmp_path / "err.log")
        assert fr.facts["log_source"]["found_by"] == f"stderr of pid {proc.pid} (vllm serve)"
        assert any(f"stdout of pid {proc.pid} goes to another file, {tmp_path / 'out.log'}" in m for m in fr.markers)
    finally:
        proc.kill()
        proc.wait()


def test_adhoc_hosts_from_a_file_and_stdin(tmp_path):
    import io

    from fleetdiag.inventory.adhoc import adhoc_inventory

    f = tmp_path / "hosts.txt"
    f.write_text("# gpu nodes\ngpu01\nalice@gpu02:2222  gpu03 # spare\n\n")
    inv = adhoc_inventory([f"^{f}", "gpu04,gpu01"])
    assert list(inv.hosts) == ["gpu01", "alice@gpu02:2222", "gpu03", "gpu04"]
    inv = adhoc_inventory(["-"], stdin=io.StringIO("gpu07\ngpu08\n"))
    assert list(inv.hosts) == ["gpu07", "gpu08"]
    f.write_text("gpu01\nbad;host\n")
    with pytest.raises(InventoryError, match="hosts.txt:2"):
        adhoc_inventory([f"^{f}"])


@pytest.mark.skipif(cgroup_dir("x") is None, reason="needs a writable cgroup hierarchy (root on Linux)")
def test_discovery_follows_a_kubernetes_container_to_its_kubelet_log(tmp_path):
    """A vllm in a kubepods cgroup (as containerd puts it): the CRI log, prefixes dropped, P lines joined."""
    kid = "ef" * 32
    logs = tmp_path / "containers"
    logs.mkdir()
    body = []
    for line in case_log().splitlines():
        body.append(f"2025-10-25T13:12:42.000000000Z stderr F {line}")
    body.insert(3, "2025-10-25T13:12:42.000000000Z stdout P first half ")
    body.insert(4, "2025-10-25T13:12:42.000000000Z stdout F and the rest")
    (logs / f"vllm-0_llm_vllm-{kid}.log").write_text("\n".join(body) + "\n")
    cg = cgroup_dir(f"kubepods/burstable/pod1234/{kid}")
    proc = None
    try:
        proc = in_cgroup(cg, [str(piped_exe(tmp_path)), "serve", "m"], tmp_path)
        time.sleep(0.5)
        spec = spec_for("", RULES)
        spec.source, spec.k8s_logs = "discover", str(logs)
        fr = funnel.run_local(spec, timeout=60)
        assert fr.facts["log_source"]["kind"] == "cri", (fr.facts, fr.markers)
        assert fr.facts["log_source"]["found_by"].startswith(
            f"pid {proc.pid} (vllm serve) runs in Kubernetes container efefefefefef"
        )
        texts = [ln.text for ln in fr.lines()]
        assert not any(t.startswith("2025-10-25T") for t in texts)
        assert "first half and the rest" in texts
        res = finish("h", fr, RULES)
        assert DECISIVE in res.decisive.line
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        for d in (cg, cg.parent, cg.parent.parent, cg.parent.parent.parent):
            try:
                d.rmdir()
            except OSError:
                pass


def piped_exe(tmp_path: Path) -> Path:
    exe = tmp_path / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.skipif(cgroup_dir("x") is None, reason="needs a writable cgroup hierarchy (root on Linux)")
def test_discovery_follows_a_docker_container_to_docker_logs(sshd, tmp_path):
    """A vllm in cgroup system.slice/docker-<id>.scope (docker's systemd driver): `docker logs` (stand-in)."""
    cid = "12" * 32
    src = tmp_path / "c.log"
    src.write_text(case_log())
    docker_standin(tmp_path / "bin", {cid: src})
    cg = cgroup_dir(f"system.slice/docker-{cid}.scope")
    proc = in_cgroup(cg, [str(piped_exe(tmp_path)), "serve", "m"], tmp_path)
    try:
        time.sleep(0.5)
        res = probe(sshd, "hosts:\n" + host_entry(sshd, "gpu09"), "gpu09", path_prepend=str(tmp_path / "bin"))
        assert res.verdict == FAILED, (res.error, res.markers)
        assert DECISIVE in res.decisive.line
        assert res.log_source == {
            "kind": "docker",
            "detail": cid,
            "found_by": f"pid {proc.pid} (vllm serve) runs in docker container 121212121212",
        }
        assert "docker logs 121212121212" in " ".join(card_text(res).split())
    finally:
        proc.kill()
        proc.wait()
        rm_cgroup(cg)


def test_a_log_path_with_repeated_16_byte_runs_is_named_right(tmp_path):
    """od folds a repeated 16-byte line into '*': the path's hex must not be folded."""
    d = tmp_path / ("a" * 48)
    d.mkdir()
    log = d / "v.log"
    log.write_text(case_log())
    fr = funnel.run_local(spec_for(str(log), RULES), timeout=60)
    assert fr.path == str(log)
