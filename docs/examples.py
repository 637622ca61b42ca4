"""The program output shown in README.md, produced by fleetdiag's own code.

README.md holds ``cog`` blocks that call these functions (``cog -r README.md``
rewrites them, from the project root; ``tests/test_docs.py`` fails when they drift). Inputs are fixed
(the demo's logs, the recorded H200 nvidia-smi, a fixed timing and clock) so
the text is the same on every machine.
"""

from __future__ import annotations

import io
from importlib import resources
from pathlib import Path

from fleetdiag import job as job_mod
from fleetdiag import render
from fleetdiag.analysis import load_rules
from fleetdiag.probe import finish
from fleetdiag.records import FunnelResult, Line, Timing

WIDTH = 80
NOW = 1_800_000_000.0  # a fixed remote clock


def _demo_log(name: str) -> str:
    return resources.files("fleetdiag").joinpath("data", "demo", name).read_text("utf-8")


def _funnel(text: str, path: str, idle: float) -> FunnelResult:
    lines, pos = [], 0
    for n, raw in enumerate(text.splitlines(keepends=True), 1):
        lines.append(Line(pos=pos, text=raw.rstrip("\n"), lineno=n))
        pos += len(raw.encode())
    return FunnelResult(path=path, size=pos, mtime=NOW - idle, now=NOW, tail=lines)


def _print(*renderables: object) -> str:
    buf = io.StringIO()
    out = render.Output(stdout=buf, color=False, width=WIDTH)
    for r in renderables:
        out.print(r)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def host_card() -> str:
    """The seeds' failure: uk-node's vLLM launch, TP 2 × DP 2 with two GPUs visible."""
    fr = _funnel(_demo_log("dp_rank.log"), "/workspace/logs/vllm.log", idle=40)
    timing = Timing(connect_ms=2400.0, rtt_ms=240.0, exec_ms=310.0, total_ms=2950.0, round_trips=1, bytes=14100)
    res = finish("uk-node", fr, load_rules(), timing=timing)
    res.address = "uk-node"
    res.evidence = []
    return _print(render.host_card(res, traceback_lines=12))


def job_view() -> str:
    """The real two-node torchrun failure of the multinode corpus (the demo's fr-node-a/b)."""
    rules = load_rules()
    results = []
    for host, name in (("node0", "job_node_a.log"), ("node1", "job_node_b.log")):
        fr = _funnel(_demo_log(name), f"/workspace/{host}/train.log", idle=60)
        res = finish(host, fr, rules, timing=Timing(rtt_ms=2.0, round_trips=1))
        kept = job_mod.job_facts(res, [ln.text for ln in fr.lines()])
        if kept is not None:
            res.job = kept
        res.log_mtime = fr.mtime
        results.append(res)
    roots = job_mod.root_causes(results)
    return _print(render.fleet_view(results, root_causes=roots))


def preflight() -> str:
    """The seeds' launch checked before it runs: the recorded 2× H200 nvidia-smi, one GPU busy."""
    from fleetdiag import preflight as pf

    smi = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nvidia-smi"
    launch = pf.plan(["vllm", "serve", "Qwen/Qwen3.6-27B", "-tp", "2", "-dp", "2"], {"CUDA_VISIBLE_DEVICES": "0,1"})
    raw = {
        "nvidia_smi": ["/usr/bin/nvidia-smi"],
        "gpu": (smi / "nvidia-smi-query-busy.csv").read_text().splitlines(),
        "app": (smi / "nvidia-smi-apps.csv").read_text().splitlines(),
    }
    checks, facts = pf.evaluate(launch, raw)
    status = pf.FAIL if any(c.status == pf.FAIL for c in checks) else pf.PASS
    res = pf.PreflightResult(host="uk-node", status=status, checks=checks, facts=facts)
    return _print(*render.preflight_view(launch, [res], launch.to_dict()))


def _fifty() -> list:
    """Fifty hosts from the demo's logs: two with the DP-rank assertion, one CUDA error, five unreachable."""
    from fleetdiag.records import UNREACHABLE, HostResult

    rules = load_rules()
    logs = {"dp_rank.log": _demo_log("dp_rank.log"), "broken_pipe.log": _demo_log("broken_pipe.log")}
    healthy = _demo_log("healthy.log")
    down = {4: 11, 7: 12, 8: 13, 10: 14, 13: 15}
    results = []
    for i in range(1, 51):
        name = f"node{i:02d}"
        if i in down:
            results.append(
                HostResult(
                    host=name,
                    verdict=UNREACHABLE,
                    error=f"connection refused by 10.0.1.{down[i]}:22 (is sshd listening on that port?)",
                    facts={"error_kind": "refused"},
                )
            )
            continue
        text = logs["dp_rank.log"] if i in (1, 2) else logs["broken_pipe.log"] if i == 5 else healthy
        fr = _funnel(text, "/data/train.log", idle=30)
        res = finish(name, fr, rules, timing=Timing(rtt_ms=18.0 + i % 7, round_trips=1))
        res.evidence = []
        results.append(res)
    return results


def fleet_50() -> str:
    """``probe all`` on fifty hosts, piped (80 columns): the table first, folds shortened before errors."""
    return _print(render.fleet_view(_fifty()))


def fleet_csv() -> str:
    """``probe all --only failed,unreachable --format csv``."""
    return render.fleet_csv(render.filter_results(_fifty(), only={"failed", "unreachable"}))


def incident_md(lines: int = 32) -> str:
    """The start of ``probe all --hide healthy --format md``."""
    rs = render.filter_results(_fifty(), hide={"healthy"})
    rep = render.incident_report(rs)
    rep.notes.append(render.filter_note(50, len(rs), None, {"healthy"}))
    text = render.report_markdown(rep).splitlines()
    return "\n".join(text[:lines]) + "\n…\n"


def lemons() -> str:
    """``history --lemons``: recurring troubles from a history of six sweeps (UTC)."""
    import os
    import tempfile
    import time

    from fleetdiag.cli.sweep import print_lemons
    from fleetdiag.records import Decisive, HostResult
    from fleetdiag.store import Store

    os.environ["TZ"] = "UTC"
    time.tzset()
    xid = Decisive(
        line="NVRM: Xid 79, GPU has fallen off the bus",
        message="Xid 79: GPU has fallen off the bus",
        fingerprint="xid79",
        category="hardware",
    )
    ecc = Decisive(
        line="NVRM: Xid 48, uncorrectable ECC error",
        message="Xid 48: uncorrectable ECC error",
        fingerprint="xid48",
        category="hardware",
    )
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "history.sqlite3"
        with Store(db) as store:
            for n in range(6):
                t = NOW + n * 3600
                gpu07 = HostResult(host="gpu07", verdict="failed", decisive=xid) if n % 2 == 0 else None
                gpu12 = HostResult(host="gpu12", verdict="failed", decisive=ecc)
                gpu12.facts["kernel_log"] = {"boot": NOW - 86400 if n < 3 else NOW + 3 * 3600 - 300}
                rs = [gpu07 or HostResult(host="gpu07", verdict="healthy"), gpu12]
                store.record_sweep(rs, started=t, finished=t + 30)
            recs = [r for r in store.recurrences() if r.lemon(3)]
        buf = io.StringIO()
        print_lemons(render.Output(stdout=buf, color=False, width=WIDTH), recs, db, 3, None)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def kernel_alone() -> str:
    """``fleetdiag analyze --kernel dmesg.txt``: the real gpu-burn report's dmesg (a fatal AER, then Xid 79)."""
    from fleetdiag.evidence.host import apply_collection
    from fleetdiag.evidence.offline import read_kernel_file
    from fleetdiag.records import HEALTHY, HostResult

    path = Path(__file__).resolve().parents[1] / "tests" / "corpus_kernel" / "gpuburn1-aer-fatal-surprise-down.kern.log"
    kc = read_kernel_file(path)
    res = HostResult(host="-", verdict=HEALTHY, summary="no application log given")
    res = apply_collection(res, FunnelResult(status="ok"), kc, live=False)
    return _print(render.host_card(res))


SSH_CONFIG = """\
Host bastion
    HostName bastion.example.net
    Port 42999
    User ops

Host gpu*
    HostName %h.dc1.example.net
    User train
    Port 42022
    ProxyJump bastion
    IdentityFile ~/.ssh/fleet_ed25519
    UserKnownHostsFile ~/.ssh/known_hosts.fleet
"""

SSH_INVENTORY = """\
hosts:
  gpu01: {logs: {train: /data/train.log}}
  infer01:
    address: 10.0.2.15
    user: serve
    logs: {vllm: /var/log/vllm.log}
"""


def hosts_ssh() -> str:
    """``fleetdiag hosts --ssh`` through the CLI: two hosts, one behind a jump host and a port from the ssh
    config. The files live in a temporary home, shown as /home/ops (the only change to the output)."""
    import os
    import tempfile

    from click.testing import CliRunner

    from fleetdiag.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home" / "ops"
        (home / "fleet").mkdir(parents=True)
        (home / "fleet" / "ssh_config").write_text(SSH_CONFIG)
        (home / "fleet" / "fleet.yaml").write_text(SSH_INVENTORY)
        # ~ in the ssh config is this home (expanduser reads HOME); paths are typed relative to it
        env = {"HOME": str(home), "COLUMNS": str(WIDTH), "NO_COLOR": "1", "XDG_CONFIG_HOME": str(home / ".config")}
        cwd = os.getcwd()
        os.chdir(home)
        try:
            res = CliRunner().invoke(
                main, ["-i", "fleet/fleet.yaml", "hosts", "--ssh", "--ssh-config", "fleet/ssh_config", "all"], env=env
            )
        finally:
            os.chdir(cwd)
        assert res.exit_code == 0, res.output
        text = res.output.replace(tmp, "")
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


def incident_html() -> str:
    """``probe all --hide healthy --format html``: the page, as fleetdiag writes it (the fifty hosts)."""
    rs = render.filter_results(_fifty(), hide={"healthy"})
    rep = render.incident_report(rs)
    rep.notes.append(render.filter_note(50, len(rs), None, {"healthy"}))
    return render.report_html(rep)


def incident_html_excerpt(lines: int = 13) -> str:
    """The first host's section of that page, as HTML source."""
    page = incident_html()
    start = page.index('<section id="s0">')
    return "\n".join(page[start:].splitlines()[:lines]) + "\n…\n"


SCREENSHOT = Path(__file__).resolve().parent / "img" / "incident-report.png"
SOURCE_KEY = b"fleetdiag-source-sha256"  # the PNG's tEXt chunk: the page it was drawn from


def page_digest() -> str:
    import hashlib

    return hashlib.sha256(incident_html().encode("utf-8")).hexdigest()


def png_source(png: bytes) -> str | None:
    """The digest a screenshot carries (``screenshot`` writes it), or None."""
    import struct

    i = 8
    while i + 8 <= len(png):
        n, kind = struct.unpack(">I4s", png[i : i + 8])
        if kind == b"tEXt":
            key, _, value = png[i + 8 : i + 8 + n].partition(b"\0")
            if key == SOURCE_KEY:
                return value.decode("ascii")
        i += 12 + n
    return None


def screenshot(out: Path = SCREENSHOT) -> Path:
    """Draw the page in headless Chromium (``python docs/examples.py --screenshot``) and mark the PNG with
    the page's digest, so tests/test_docs.py knows when the page changed and the picture is stale."""
    import shutil
    import struct
    import subprocess
    import tempfile
    import zlib

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        raise SystemExit("chromium is needed for the screenshot")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(incident_html(), "utf-8")
        shot = Path(tmp) / "shot.png"
        argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]
        argv += [f"--user-data-dir={tmp}/profile", f"--screenshot={shot}", "--window-size=1000,1150", page.as_uri()]
        subprocess.run(argv, capture_output=True, timeout=120, check=True)
        png = shot.read_bytes()
    body = SOURCE_KEY + b"\0" + page_digest().encode("ascii")
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
    end_ihdr = 8 + 12 + struct.unpack(">I", png[8:12])[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png[:end_ihdr] + chunk + png[end_ihdr:])
    return out


if __name__ == "__main__":  # a quick look: python docs/examples.py  (--screenshot: redraw docs/img)
    import sys

    if "--screenshot" in sys.argv:
        print(screenshot())
        raise SystemExit(0)
    print(host_card())
    print(job_view())
    print(preflight())
    print(fleet_50())
    print(fleet_csv())
    print(incident_md())
    print(lemons())
    print(kernel_alone())
