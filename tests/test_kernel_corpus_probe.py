"""Every kernel case, end to end: ``fleetdiag probe`` over a real OpenSSH sshd, the verdict and the decisive
line asserted on the card and in ``--json``.

Each case is two hosts of one inventory, probed by one ``probe --json`` and one text ``probe``:

- ``job-<case>``: the job that died of the fault. Its log is the case's application log, or (a case with
  kernel lines only) a training log that fell silent 20 s after the fault. The host is ``failed`` with the
  kernel line as the cause.
- ``idle-<case>``: a serving log that is alive and healthy. An unrecovered GPU fault of the current boot makes
  the host ``degraded`` with that kernel line, whether or not nvidia-smi is installed; anything else (an
  application's own Xid, an OOM kill, a hung task, corrected PCIe errors) leaves it healthy.

Every host has its own tools dir (the inventory's ``path_prepend``): journald-form cases are served by a
``journalctl`` stand-in in the output format kernel.sh asks for; dmesg-form cases (seconds since boot, ``-T``,
``-H``, grep output) by a plain ``dmesg`` stand-in in seconds since boot below this machine's real uptime,
the recorded intervals kept (silences longer than GAP_CAP shortened to it). Half the hosts of each kind have
no ``nvidia-smi`` on their PATH at all.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag import timestamps
from fleetdiag.cli import main
from fleetdiag.evidence.kernel import Clock, split_time

from .conftest import inventory_file
from .test_kernel_evidence import BY_KIND, CORPUS, OTHER, STANDINS, _smi_spec

HERE = Path(__file__).resolve().parent
OWN = HERE / "corpus_kernel"  # real cases with kernel lines only, of the classes the shared corpus lacks
EXTRA = HERE / "corpus_kernel_extra"  # more real cases in the shared label format, where present
CASE_FILES = sorted(
    [*CORPUS.glob("*.json"), *OWN.glob("*.json"), *(EXTRA.glob("*.json") if EXTRA.is_dir() else [])],
    key=lambda p: p.stem,
)
CATEGORY = {**BY_KIND, "gpu-init": "driver"}
# An adapter that fails to initialise is named a driver fault (reset or reboot first; drain and RMA if it
# persists), whatever its report later found below it.
CATEGORY_OF = {"cmpunlocker4-rminitadapter-cannot-attach": "driver"}
# Shared cases whose fault is of the hardware or driver class but does not stand alone, and why.
NOT_ALONE = {
    "gpud117-xid45-hung-task": "a task blocked 120 s can be any driver or I/O; it explains a dead job, not a node",
    "returnn1486-pcie-aer-corrected-gpu-unknown": "corrected PCIe errors are never a fault on their own",
}
GAP_CAP = 200.0  # seconds: a longer silence between recorded lines is shortened to this
END_AGO = 90.0  # the last recorded line is this long before the probe
TRAINING = "".join(f"epoch 3 step {i * 100} loss {1.3 - i / 100:.2f}\n" for i in range(1, 20))
HEALTHY_LOG = HERE.parent / "fleetdiag" / "data" / "demo" / "healthy.log"


def _case(path: Path) -> dict:
    case = json.loads(path.read_text(encoding="utf-8"))
    case["_dir"] = path.parent
    return case


CASES = [_case(p) for p in CASE_FILES]
# native programs' errors paired with kernel lines (tests/fixtures/kernel_native/README.md): a job host each
NATIVE = [_case(p) for p in sorted((HERE / "fixtures" / "kernel_native").glob("*.json"))]


# Where a label names one of two lines that state one fault of one process, the other is right too: the same
# pid's Xid 13 (graphics exception) opens the burst 200 ms before its Xid 31 (the MMU fault the label names);
# both are the application's, with the same action.
ALSO_RIGHT = {"h200rec-xid13-xid31-cuda-invalid-address-space": "NVRM: Xid (PCI:0000:00:06): 13, pid=1623"}


def names_the_line(case: dict, line: str) -> bool:
    """Does ``line`` hold the case's decisive kernel line (or the one other line the label's fault allows)?"""
    return case["decisive_kernel_line"] in line or (case["id"] in ALSO_RIGHT and ALSO_RIGHT[case["id"]] in line)


def _category(case: dict) -> str:
    return CATEGORY_OF.get(case["id"]) or CATEGORY.get(case["kind"]) or OTHER[case["id"]]


def stands_alone(case: dict) -> bool:
    """Does the case's fault make a live host degraded on its own? The label says, else its class does."""
    if "stands_alone" in case:
        return bool(case["stands_alone"])
    return _category(case) in ("hardware", "driver") and case["id"] not in NOT_ALONE


def _form(case: dict) -> str:
    """journal for syslog/journald recordings and for the dmesg -T ones paired with an application log (its
    stamps are wall time: the journal keeps them so); dmesg for the rest."""
    fmt = case.get("kern_time_format", "")
    if "journald" in fmt or "syslog" in fmt:
        return "journal"
    if "-T" in fmt and case["files"].get("app"):
        return "journal"
    return "dmesg"


# ---------------------------------------------------------------- recordings as the node's tools print them

_CTIME = re.compile(r"^\[(?:[A-Za-z]{3}\s+)?([A-Za-z]{3})\s+(\d{1,2})\s+(\d\d:\d\d:\d\d)\s+\d{4}\]\s?")


def _journal_recording(lines: list[str]) -> list[str]:
    """Syslog-form lines as recorded; dmesg -T lines become the journal's 'Mon DD HH:MM:SS node kernel: ...'."""
    out = []
    for ln in lines:
        m = _CTIME.match(ln)
        out.append(f"{m.group(1)} {int(m.group(2)):2d} {m.group(3)} node kernel: {ln[m.end() :]}" if m else ln)
    return out


def _journal_epoch(line: str) -> float:
    """The epoch the journal stand-in gives a recorded line: the latest year that puts it not after now (the
    year rule of ``fleetdiag.timestamps`` without its day of slack: a journal's stamps are never in the
    future), UTC. The stand-in itself runs under the node's ``python3 -S``, which cannot import fleetdiag."""
    m = re.match(r"([A-Za-z]{3})\s+(\d{1,2})\s+(\d\d):(\d\d):(\d\d)", line)
    assert m, line
    month = timestamps.month_number(m.group(1))
    assert month, line
    stamp = timestamps.Stamp(month, *(int(g) for g in m.groups()[1:]))
    t = timestamps.stamp_epoch(stamp, ref=time.time() - timestamps.SLACK_S)
    assert t is not None, line
    return t


def _dmesg_recording(lines: list[str], uptime: float) -> tuple[list[str], list[float | None]]:
    """Any recorded dmesg form as plain dmesg prints it: '[  seconds.micro] message', in seconds since this
    machine's boot, the last line END_AGO before now. Continuation lines (indented, no stamp) stay as they are."""
    clock = Clock(now=0.0, uptime=0.0, tz_offset=0, year=2024)  # boot at epoch 0: boot seconds read as they are
    state: dict[str, float | None] = {"human": 0.0}  # dmesg -H with no header: relative to the first line
    parsed: list[tuple[float | None, str, bool]] = []
    last = 0.0
    for ln in lines:
        if re.match(r"^\s+NVRM: ", ln):
            parsed.append((None, ln, True))
            continue
        t, msg = split_time(ln, clock, state)
        t = last if t is None else t
        last = t
        parsed.append((t, msg, False))
    times = sorted({t for t, _, cont in parsed if not cont and t is not None})
    mapped: dict[float, float] = {}
    acc = 0.0
    for i, t in enumerate(times):
        if i:
            acc += min(t - times[i - 1], GAP_CAP)
        mapped[t] = acc
    span = acc
    room = uptime - END_AGO - 1.0
    scale = 1.0 if span <= room else room / span  # only on a machine booted minutes ago
    base = uptime - END_AGO - span * scale
    out, at = [], []
    for t, msg, cont in parsed:
        if cont:
            out.append(msg)
            at.append(None)
            continue
        b = base + mapped[t] * scale
        out.append(f"[{b:12.6f}] {msg}")
        at.append(b)
    return out, at


# ---------------------------------------------------------------- one inventory, two probes


def _bindir(d: Path, *, mode: str, kern: Path, smi: Path | None) -> Path:
    """This host's tools: dmesg and journalctl always, nvidia-smi only when ``smi`` is given."""
    d.mkdir(parents=True, exist_ok=True)
    env = {"FD_STANDIN_MODE": mode, "FD_STANDIN_KERN": str(kern), "FD_STANDIN_SMI": str(smi or "")}
    # what the stand-in would print, without starting it: plain dmesg prints the recording as it is; the
    # journal of a node whose kernel lines come from dmesg has none for this user
    fast = {
        "dmesg": f"if [ $# -eq 0 ] && [ '{mode}' = dmesg ]; then exec cat '{kern}'; fi\n",
        "journalctl": f"if [ '{mode}' != journal ]; then exit 0; fi\n",
        "nvidia-smi": "",
    }
    for tool in ("dmesg", "journalctl", *(["nvidia-smi"] if smi else [])):
        exe = d / tool
        exe.write_text(
            "#!/bin/sh\n"
            + fast[tool]
            + "".join(f"{k}='{v}'; export {k}\n" for k, v in env.items())
            + f"exec python3 -S '{STANDINS / tool}' \"$@\"\n"  # -S: no site import, half the start-up
        )
        exe.chmod(0o755)
    return d


def _host_setup(case: dict, role: str, root: Path, uptime: float, smi: bool) -> dict:
    """Write one host's tools, kernel recording and log; return what its assertions need."""
    d = root / f"{role}-{case['id']}"
    d.mkdir(parents=True)
    raw = (case["_dir"] / case["files"]["kern"]).read_text(encoding="utf-8").splitlines()
    form = _form(case)
    kern = d / "kern.txt"
    if form == "journal":
        rec = _journal_recording(raw)
        kern.write_text("\n".join(rec) + "\n", encoding="utf-8")
        line = next(ln for ln in rec if case["decisive_kernel_line"] in ln)
        fault_at = _journal_epoch(line)
    else:
        rec, at = _dmesg_recording(raw, uptime)
        kern.write_text("\n".join(rec) + "\n", encoding="utf-8")
        i = next(i for i, ln in enumerate(rec) if case["decisive_kernel_line"] in ln)
        boot = time.time() - uptime
        fault_at = boot + (at[i] if at[i] is not None else 0.0)
    smi_path = _smi_spec(case, d) if smi else None
    bindir = _bindir(d / "bin", mode=form if form == "journal" else "dmesg", kern=kern, smi=smi_path)
    log = d / "app.log"
    app = case["files"].get("app")
    if role == "job":
        if app:
            log.write_bytes((case["_dir"] / app).read_bytes())
            t = fault_at + 30
        else:
            log.write_text(TRAINING)
            t = fault_at + 20
        os.utime(log, (t, t))
    else:
        log.write_text(HEALTHY_LOG.read_text(encoding="utf-8"))
    return {"name": d.name, "bindir": bindir, "log": log, "case": case, "role": role, "smi": smi, "form": form}


@pytest.fixture(scope="module")
def fleet(sshd, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("kcorpus")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    hosts = []
    turn = {True: 0, False: 0}  # alternate nvidia-smi present/absent within each kind of case
    for case in CASES:
        k = stands_alone(case)
        turn[k] += 1
        has_smi = bool(case["files"].get("smi"))
        hosts.append(_host_setup(case, "job", root, uptime, smi=has_smi or turn[k] % 2 == 0))
        hosts.append(_host_setup(case, "idle", root, uptime, smi=turn[k] % 2 == 1))
    for case in NATIVE:
        hosts.append(_host_setup(case, "job", root, uptime, smi=False))
    inv = inventory_file(
        root / "inventory.yaml", {h["name"]: {"path_prepend": str(h["bindir"]), "log": h["log"]} for h in hosts}, sshd
    )
    args = [
        "--no-color",
        "-i",
        str(inv),
        "probe",
        "all",
        *sshd.cli_args(),
        "--timeout",
        "120s",
        "--all-cards",
        # every host's stand-ins are Python programs: 64 at once on a 2-core CI box can take longer than the
        # funnel's 10 s for a first journalctl answer, and a node whose journal did not answer in time is
        # read from its other sources (this test is about the verdicts, not the fanout)
        "--fanout",
        "16",
    ]
    env = {"COLUMNS": "3000", "NO_COLOR": "1"}

    stop = threading.Event()

    def live() -> None:  # a serving log is written to all the time, while the probes run too
        while True:
            for h in hosts:
                if h["role"] == "idle":
                    os.utime(h["log"], None)
            if stop.wait(2.0):
                return

    writer = threading.Thread(target=live, daemon=True)
    writer.start()
    try:
        t0 = time.monotonic()
        r = CliRunner().invoke(main, [*args, "--json"], env=env)
        doc = json.loads(r.output)
        t1 = time.monotonic()
        text = CliRunner().invoke(main, args, env=env)
        print(f"probe --json: {t1 - t0:.1f} s, probe: {time.monotonic() - t1:.1f} s for {len(hosts)} hosts")
    finally:
        stop.set()
        writer.join()
    return {
        "hosts": {h["name"]: h for h in hosts},
        "json": {h["host"]: h for h in doc["hosts"]},
        "code": r.exit_code,
        "text": text.output,
        "text_code": text.exit_code,
    }


def _card(text: str, name: str) -> str:
    """The lines of one host's card in the text output."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.search(rf"[✗▼✓⏸?…⚠] {re.escape(name)}\s", ln))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("╰")), len(lines))
    return "\n".join(lines[start : end + 1])


IDS = [c["id"] for c in CASES]


def test_every_case_is_probed(fleet: dict) -> None:
    assert len(CASES) >= 17 + 10
    assert set(fleet["json"]) == set(fleet["hosts"]) and NATIVE
    assert fleet["code"] == 1 and fleet["text_code"] == 1  # failed and degraded hosts: exit 1
    with_smi = [h for h in fleet["hosts"].values() if h["smi"]]
    assert 0.3 < len(with_smi) / len(fleet["hosts"]) < 0.7
    alone = [fleet["hosts"][f"idle-{c['id']}"] for c in CASES if stands_alone(c)]
    without = [h for h in alone if not h["smi"]]
    assert abs(len(without) - len(alone) / 2) <= 0.5  # half the hardware/driver faults with no nvidia-smi


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_job_that_died_of_it_names_the_kernel_line(fleet: dict, case: dict) -> None:
    name = f"job-{case['id']}"
    host = fleet["json"][name]
    d = host["decisive"]
    assert host["verdict"] == "failed", host
    assert d is not None and d["source"] == "kernel", d
    assert names_the_line(case, d["line"]), d
    for decoy in case["decoys"]:
        assert decoy not in d["line"]
    assert d["category"] == _category(case), d
    assert d["hint"] and d["fingerprint"]
    source = {"journal": "journalctl", "dmesg": "dmesg"}[fleet["hosts"][name]["form"]]
    assert host["facts"]["kernel_log"]["source"] == source
    assert any(e["source"] == "kernel" and e["line"] == d["line"] for e in host["evidence"])
    if case["files"].get("app") and d["consequence"]:
        assert host["evidence"][0]["source"] == "log" and host["evidence"][0]["line"] == d["consequence"]
    if case.get("xid") and d["exception_type"].startswith("Xid") and case["id"] not in ALSO_RIGHT:
        assert d["exception_type"] == f"Xid {case['xid']}", d
    card = _card(fleet["text"], name)
    assert "FAILED" in card
    row = next(ln for ln in card.splitlines() if "kernel line" in ln)
    assert names_the_line(case, row), row
    assert f"kernel log ({source})" in card


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_live_host_with_the_fault_is_degraded_or_healthy(fleet: dict, case: dict) -> None:
    name = f"idle-{case['id']}"
    host = fleet["json"][name]
    d = host["decisive"]
    card = _card(fleet["text"], name)
    smi = fleet["hosts"][name]["smi"]
    source = {"journal": "journalctl", "dmesg": "dmesg"}[fleet["hosts"][name]["form"]]
    assert host["facts"]["kernel_log"]["source"] == source, host["facts"]["kernel_log"]
    if stands_alone(case):
        assert host["verdict"] == "degraded", host
        assert d is not None and d["source"] == "kernel", d
        assert case["decisive_kernel_line"] in d["line"], d
        for decoy in case["decoys"]:
            assert decoy not in d["line"]
        assert d["category"] == _category(case) and d["hint"], d
        assert d["consequence"] is None
        if not smi:
            assert "nvidia-smi is not installed" in d["reason"], d
        else:
            assert "nvidia-smi" in d["reason"] and "not installed" not in d["reason"], d
        assert "DEGRADED" in card and "no job failed, but a GPU is faulty" in card
        row = next(ln for ln in card.splitlines() if "kernel line" in ln)
        assert case["decisive_kernel_line"] in row
        hint = next(ln for ln in card.splitlines() if "│ hint" in ln)
        assert d["hint"][:40] in hint
        return
    assert d is None, d  # an application's own fault, an OOM kill, corrected errors: not the node's
    smi_fault = smi and case["files"].get("smi")
    assert host["verdict"] == ("degraded" if smi_fault else "healthy"), host
    assert ("DEGRADED" if smi_fault else "HEALTHY") in card


def test_fallen_off_the_bus_without_nvidia_smi(fleet: dict) -> None:
    """A GPU off the bus (or lost from it) and no nvidia-smi on the node: degraded, the kernel line, the drain/RMA hint."""
    lost = [c for c in CASES if c["kind"] == "gpu-lost" and not fleet["hosts"][f"idle-{c['id']}"]["smi"]]
    assert lost, "a gpu-lost case is served with no nvidia-smi"
    for case in lost:
        host = fleet["json"][f"idle-{case['id']}"]
        assert host["verdict"] == "degraded"
        d = host["decisive"]
        said = next((s for s in ("fallen off the bus", "lost from the bus", "GPU is lost") if s in d["line"]), None)
        assert said and d["category"] == "hardware", d
        assert "drain" in d["hint"] and ("RMA" in d["hint"] or "power-cycle" in d["hint"])
        assert host["facts"]["kernel_log"]["kernel_log"] == "read"
        card = _card(fleet["text"], f"idle-{case['id']}")
        assert said in card and "drain" in card


@pytest.mark.parametrize("case", NATIVE, ids=[c["id"] for c in NATIVE])
def test_a_native_programs_error_correlates_with_the_kernel_line(fleet: dict, case: dict) -> None:
    """No Python traceback: the shell's 'Segmentation fault (core dumped)' of a C++ server is tied to the
    kernel's segfault line by the program's name (container and host pids differ), over an Xid of the same
    second that names another process."""
    name = f"job-{case['id']}"
    host = fleet["json"][name]
    d = host["decisive"]
    assert host["verdict"] == "failed" and d["source"] == "kernel", host
    assert case["decisive_kernel_line"] in d["line"] and d["category"] == _category(case), d
    assert case["decisive_app_line"] in (d["consequence"] or ""), d
    for decoy in case["decoys"]:
        assert decoy not in d["line"]
    assert "process tritonserver" in d["reason"] and d["confidence"] >= 0.9, d
    assert host["evidence"][0]["source"] == "log" and case["decisive_app_line"] in host["evidence"][0]["line"]
    card = _card(fleet["text"], name)
    cons = next(ln for ln in card.splitlines() if "consequence" in ln)
    assert case["decisive_app_line"] in cons


def test_the_json_host_record_keeps_its_shape(fleet: dict) -> None:
    for host in fleet["json"].values():
        assert all(set(e) == {"source", "time", "line", "pid", "gpu", "kind", "code"} for e in host["evidence"])
        assert host["verdict"] in ("failed", "degraded", "healthy")


def test_dmesg_recordings_stay_below_the_real_uptime() -> None:
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    for case in CASES:
        if _form(case) != "dmesg":
            continue
        raw = (case["_dir"] / case["files"]["kern"]).read_text(encoding="utf-8").splitlines()
        rec, at = _dmesg_recording(raw, uptime)
        stamps = [a for a in at if a is not None]
        assert stamps and 0 < min(stamps) and max(stamps) == pytest.approx(uptime - END_AGO)
        assert all(re.match(r"^\[\s*\d+\.\d{6}\] |^\s+NVRM: ", ln) for ln in rec), rec


def test_journal_stand_in_answers_in_the_format_asked(tmp_path: Path) -> None:
    kern = tmp_path / "k.txt"
    kern.write_text("Aug 10 15:36:05 gpu-node-a kernel: NVRM: Xid (PCI:0000:55:00): 48, DBE\n-- Boot 1f --\n")
    env = {**os.environ, "FD_STANDIN_MODE": "journal", "FD_STANDIN_KERN": str(kern)}

    def run(*a: str) -> str:
        return subprocess.run(
            [str(STANDINS / "journalctl"), *a], env=env, capture_output=True, text=True, check=False
        ).stdout

    y = _journal_epoch("Aug 10 15:36:05")
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(y))
    assert run("-k", "-o", "short-iso-precise").startswith(f"{iso}.000000+0000 gpu-node-a kernel: NVRM: Xid")
    assert run("-k", "-o", "short-iso").startswith(f"{iso}+0000 gpu-node-a kernel:")
    assert run("-k", "-o", "short-precise").startswith("Aug 10 15:36:05.000000 gpu-node-a kernel:")
    assert run("-k").startswith("Aug 10 15:36:05 gpu-node-a kernel:")
    assert run("-k", "-b", "-o", "short-iso") == ""  # after the last boot separator: nothing of this boot
    for fmt in ("short-iso-precise", "short-iso", "short-precise", "short", "short-full"):
        line = run("-k", "-o", fmt).splitlines()[0]
        t, msg = split_time(line, Clock(now=time.time(), uptime=100.0, tz_offset=0), {})
        assert t == pytest.approx(y) and msg.startswith("NVRM: Xid"), (fmt, line)
