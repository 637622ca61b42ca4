"""Accuracy of the decisive line on every corpus, and which rules each case needs.

    .venv/bin/python bench/accuracy.py                # table + rule support (~seconds)
    .venv/bin/python bench/accuracy.py --subprocess   # one `fleetdiag analyze` process per case
    .venv/bin/python bench/accuracy.py --json out.json

Part 1, **accuracy through the CLI**: every case's log goes through
``fleetdiag analyze --json`` (the real funnel script through the local ``sh``,
then ``probe.finish`` and the JSON the user reads), by default in this
process through click's runner (``--subprocess``: one process per case, the
same command a user types). A case is *right* when the reported line contains
the labelled decisive text (or an accepted alternative) and no decoy, and the
verdict is the labelled one (``failed``, or for a log that did not fail
``healthy``, ``starting`` or ``stalled``); *decoy* when it names a decoy
instead. Each log goes through a fresh copy: a pasted log has no "now", so it
is judged as read right after it was written (its age on disk never turns a
log that ends while starting into a stall).

Sets: shared/corpus/dev, shared/corpus/kernel, tests/corpus_kernel and
tests/corpus_kernel_extra (the app log with
``--kernel``, when ``analyze`` has it), shared/corpus/multinode and
tests/corpus_multinode (per node: the root node's own error; a victim's line
must be marked ``peer-caused``), tests/corpus, tests/corpus_extra,
tests/corpus_heldout, tests/corpus_heldout2, tests/corpus_heldout3, tests/corpus_heldout4,
tests/corpus_heldout5, tests/corpus_heldout6, tests/corpus_heldout7, tests/corpus_heldout8, tests/corpus_heldout9,
tests/corpus_heldout10, tests/corpus_heldout11, tests/corpus_heldout12, tests/corpus_heldout13, tests/corpus_heldout14 and tests/corpus_heldout15
with their kernel/ cases (the held-back sets: their rows are the generalisation measure, the fourteenth's never tuned
on).

Part 2, **rule support**, in-process (``analyze_text`` on the whole log, no
funnel, for speed; the kernel sets through ``analyze --kernel``). Every rule:
``Rules.rule_ids`` (signatures, secondary rules, data/peer.yaml's peer_caused
kinds, benign/serving/ready/waiting/run_start entries), the rules written in
code (``CODE_RULES``: the decisive event's form in analysis/tracebacks.py, the
demotions and promotions of analysis/decide.py, the steps of
analysis/normalise.py) and the kernel evidence classes of
evidence/correlate.py (``KERNEL_RULES``). For each, three numbers:

- *fires*: the right cases where the rule matched a line the decision used
  (``fires_on`` says what that is per section: for a signature, the decisive
  line's rule; for a secondary or peer rule, a role it gave to the decisive line
  or to a line the decision demoted; for benign, serving, ready, waiting and
  run_start, a line of a case whose verdict that section decides). The list
  sections are observed through a subclass of ``Rules`` that notes every
  pattern matching a line, shadowed ones too; production code is not patched.
- *src*: the distinct sources of those cases (``source_key``: a GitHub issue,
  pull request or discussion with all its comments is one source, a file on
  GitHub its repository and path, a recording one source per recorded
  program). **A rule is supported when it fires on cases from >= 2 sources.**
- *needed*: the cases that turn wrong when that one rule is disabled
  (``Rules.without``); "-" for rules in code, which cannot be disabled.

Xid codes: the *rule* is the class ("an Xid whose catalog class is hardware or
driver stands alone", "an application or informational Xid never does", "an
Xid with a pid or name correlates to the process"), counted with the kernel
classes; the codes are data from NVIDIA's Xid catalog (data/xid.yaml, a
documented source), listed per code as ``xid:N`` and totalled apart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHARED = Path(os.environ.get("FLEETDIAG_SHARED", "/work/shared"))
TESTS = REPO / "tests"


@dataclass
class Case:
    """One log to judge: its label reduced to what the judgement needs."""

    set: str
    id: str
    log: Path
    accepted: list[str]  # any of these substrings in the decisive line is right ([] = no error expected)
    decoys: list[str] = field(default_factory=list)
    verdict: str = "failed"
    source: str = ""
    role: str | None = None  # the role the decisive line must have (a victim: peer-caused)
    kernel: Path | None = None
    smi: Path | None = None
    category: str | None = None  # the labelled category, when the label has one
    app: Path | None = None  # a kernel case's own app log (the correlation of the two)
    kernel_line: str | None = None  # a kernel case's labelled decisive kernel line


def _label(p: Path) -> dict[str, Any]:
    return json.loads(p.read_text(encoding="utf-8"))


def single_host_set(name: str, folder: Path) -> list[Case]:
    """tests/corpus/README.md labels: decisive, decisive_alt, decoys, verdict."""
    out = []
    for p in sorted(folder.glob("*.json")):
        lab = _label(p)
        if "decisive" not in lab or not p.with_suffix(".log").is_file():
            continue
        verdict = lab.get("verdict", "failed")
        acc = [] if verdict != "failed" else [lab["decisive"], *lab.get("decisive_alt", [])]
        out.append(
            Case(
                name,
                p.stem,
                p.with_suffix(".log"),
                acc,
                list(lab.get("decoys", [])),
                verdict,
                lab.get("source", ""),
                category=lab.get("category") if verdict == "failed" else None,
            )
        )
    return out


def multinode_set(name: str, folder: Path) -> list[Case]:
    """Per node of a job: the root node's own error; a victim's line is its own peer-caused error.

    A hang's root is the straggler, a node with no error of its own (its last
    ordinary line is the label): only the job analysis can name it, so it is
    not a single-host case.
    """
    out = []
    for p in sorted(folder.glob("*.json")):
        lab = _label(p)
        logs = lab.get("logs") or {}
        for host, fname in sorted(logs.items()):
            log = p.parent / fname
            if not log.is_file():
                continue
            src = lab.get("source", "")
            cid = f"{p.stem}.{host}"
            if host == lab.get("root_host"):
                if lab.get("kind") == "hang":
                    continue
                out.append(Case(name, cid, log, list(lab.get("root_line_any", [])), [], "failed", src))
            elif host in (lab.get("victims") or {}):
                out.append(Case(name, cid, log, [], [], "failed", src, role="peer-caused"))
    return out


def kernel_set(name: str, folder: Path) -> list[Case]:
    """The kernel corpus, judged as a live host whose kernel log holds the fault (``analyze --kernel``).

    A fault that stands on its own (hardware, driver) makes the host
    ``degraded`` with the kernel line; any other (an application's Xid, an OOM
    kill, corrected errors) leaves it ``healthy``. Which is which is the
    kernel corpus's own reading of its labels (tests/test_kernel_corpus_probe.py);
    without it the set is not run.
    """
    try:
        from tests import test_kernel_corpus_probe as kc  # the labels' reading, shared with its e2e test
    except Exception:
        return []
    out = []
    for p in sorted(folder.glob("*.json")):
        lab = _label(p)
        files = lab.get("files") or {}
        if not files.get("kern") or "decisive_kernel_line" not in lab:
            continue
        try:
            alone = kc.stands_alone(lab)
            also = getattr(kc, "ALSO_RIGHT", {}).get(lab["id"])
        except Exception:
            continue
        acc = [lab["decisive_kernel_line"], *([also] if also else [])] if alone else []
        out.append(
            Case(
                name,
                p.stem,
                Path(os.devnull),
                acc,
                list(lab.get("decoys", [])),
                "degraded" if alone or files.get("smi") else "healthy",  # nvidia-smi's own fault refines it
                lab.get("source", ""),
                kernel=p.parent / files["kern"],
                smi=p.parent / files["smi"] if files.get("smi") else None,
                app=p.parent / files["app"] if files.get("app") and (p.parent / files["app"]).is_file() else None,
                kernel_line=lab.get("decisive_kernel_line"),
            )
        )
    return out


def all_sets() -> dict[str, list[Case]]:
    """Every corpus present on this machine, by set name."""
    sets: dict[str, list[Case]] = {}
    for name, folder, fn in (
        ("dev", SHARED / "corpus" / "dev", single_host_set),
        ("kernel", SHARED / "corpus" / "kernel", kernel_set),
        ("tests/corpus_kernel", TESTS / "corpus_kernel", kernel_set),
        ("tests/corpus_kernel_extra", TESTS / "corpus_kernel_extra", kernel_set),
        ("multinode", SHARED / "corpus" / "multinode", multinode_set),
        ("tests/corpus", TESTS / "corpus", single_host_set),
        ("tests/corpus_extra", TESTS / "corpus_extra", single_host_set),
        ("tests/corpus_heldout", TESTS / "corpus_heldout", single_host_set),
        ("tests/corpus_heldout/kernel", TESTS / "corpus_heldout" / "kernel", kernel_set),
        ("tests/corpus_heldout2", TESTS / "corpus_heldout2", single_host_set),
        ("tests/corpus_heldout3", TESTS / "corpus_heldout3", single_host_set),
        ("tests/corpus_heldout4", TESTS / "corpus_heldout4", single_host_set),
        ("tests/corpus_heldout4/kernel", TESTS / "corpus_heldout4" / "kernel", kernel_set),
        ("tests/corpus_heldout5", TESTS / "corpus_heldout5", single_host_set),
        ("tests/corpus_heldout5/kernel", TESTS / "corpus_heldout5" / "kernel", kernel_set),
        ("tests/corpus_heldout6", TESTS / "corpus_heldout6", single_host_set),
        ("tests/corpus_heldout6/kernel", TESTS / "corpus_heldout6" / "kernel", kernel_set),
        ("tests/corpus_heldout7", TESTS / "corpus_heldout7", single_host_set),
        ("tests/corpus_heldout7/kernel", TESTS / "corpus_heldout7" / "kernel", kernel_set),
        ("tests/corpus_heldout8", TESTS / "corpus_heldout8", single_host_set),
        ("tests/corpus_heldout9", TESTS / "corpus_heldout9", single_host_set),
        ("tests/corpus_heldout10", TESTS / "corpus_heldout10", single_host_set),
        ("tests/corpus_heldout11", TESTS / "corpus_heldout11", single_host_set),
        ("tests/corpus_heldout12", TESTS / "corpus_heldout12", single_host_set),
        ("tests/corpus_heldout13", TESTS / "corpus_heldout13", single_host_set),
        ("tests/corpus_heldout14", TESTS / "corpus_heldout14", single_host_set),
        ("tests/corpus_heldout15", TESTS / "corpus_heldout15", single_host_set),
        ("tests/corpus_multinode", TESTS / "corpus_multinode", multinode_set),
    ):
        if folder.is_dir():
            cases = fn(name, folder)
            if cases:
                sets[name] = cases
    return sets


RIGHT, WRONG, DECOY = "right", "wrong", "decoy"


Answer = tuple[str | None, str | None, str | None, str | None]  # verdict, decisive line, role, category


def judge(case: Case, verdict: str | None, line: str | None, role: str | None, category: str | None = None) -> str:
    """right, wrong, or decoy (a decoy named instead of the decisive line); the labelled category counts."""
    line = line or ""
    if case.verdict == "degraded":  # a kernel fault on a live host: the verdict and the kernel line
        if any(d in line for d in case.decoys):
            return DECOY
        named = not case.accepted or any(a in line for a in case.accepted)
        return RIGHT if verdict == "degraded" and named else WRONG
    if case.verdict != "failed":
        if verdict == case.verdict:
            return RIGHT
        return DECOY if any(d in line for d in case.decoys) else WRONG
    if verdict != "failed" or not line:
        return WRONG
    if any(d in line for d in case.decoys):
        return DECOY
    if case.role is not None and role != case.role:
        return WRONG
    if case.accepted and not any(a in line for a in case.accepted):
        return WRONG
    if case.category is not None and category != case.category:
        return WRONG
    return RIGHT


# ------------------------------------------------------------------ part 1: through the CLI


def _kernel_supported() -> bool:
    from fleetdiag.cli.analyze import analyze

    return any("--kernel" in getattr(p, "opts", ()) for p in analyze.params)


def _argv(case: Case, kernel_ok: bool) -> list[str] | None:
    argv = ["analyze", "--json"] + ([] if str(case.log) == os.devnull else [str(case.log)])
    if case.kernel is not None:
        if not kernel_ok:
            return None
        argv += ["--kernel", str(case.kernel)]
        if case.smi is not None:
            argv += ["--smi", str(case.smi)]
    return argv


def run_cli(
    cases: list[Case], subprocess_mode: bool = False, raw: dict[str, dict[str, Any]] | None = None, app: bool = False
) -> dict[str, Answer]:
    """Each case through ``fleetdiag analyze --json``: {id: (verdict, decisive line, role, category)}.

    ``raw`` receives each case's whole host record; ``app`` runs a kernel case with its own app log.
    """
    from click.testing import CliRunner

    kernel_ok = _kernel_supported()
    runner = CliRunner()
    out: dict[str, Answer] = {}
    env = {**os.environ, "XDG_CONFIG_HOME": os.devnull}  # never the user's own rules
    with tempfile.TemporaryDirectory(prefix="fleetdiag-accuracy-") as tmp:
        for k, c in enumerate(cases):
            argv = _argv(c, kernel_ok)
            if argv is None:
                continue
            if str(c.log) != os.devnull:
                # a pasted log has no "now": judge it as read right after it was written (a fresh copy), so the
                # checkout's age on disk never turns a log that ends while starting into a stall
                fresh = Path(tmp) / f"{k}-{c.log.name}"
                shutil.copyfile(c.log, fresh)
                argv[argv.index(str(c.log))] = str(fresh)
            _run_one(c, argv, app, subprocess_mode, runner, env, out, raw)
    return out


def _run_one(
    c: Case,
    argv: list[str],
    app: bool,
    subprocess_mode: bool,
    runner: Any,
    env: dict[str, str],
    out: dict[str, Answer],
    raw: dict[str, dict[str, Any]] | None,
) -> None:
    """One case through the CLI: its answer into ``out`` (and its host record into ``raw``)."""
    from fleetdiag.cli import main

    if app and c.app is not None:
        argv.insert(2, str(c.app))
    if subprocess_mode:
        exe = Path(sys.executable).with_name("fleetdiag")
        proc = subprocess.run([str(exe), *argv], capture_output=True, text=True, env=env, timeout=120)
        text = proc.stdout
    else:
        text = runner.invoke(main, argv, env={"XDG_CONFIG_HOME": os.devnull}).output
    try:
        data = json.loads(text)
    except ValueError:
        out[c.id] = (None, None, None, None)
        return
    if isinstance(data, dict) and "hosts" in data:
        data = data["hosts"][0]
    if raw is not None:
        raw[c.id] = data
    dec = data.get("decisive") or {}
    out[c.id] = (data.get("verdict"), dec.get("line"), dec.get("role"), dec.get("category"))


# ------------------------------------------------------------------ part 2: rule support

# A GitHub issue, pull request or discussion and its own comments are one source; a file on GitHub is
# its repository and path; a recording is its recording script or program.
_GH = re.compile(r"https?://github\.com/([^/\s]+/[^/\s#?]+)/(?:issues|pull|discussions)/(\d+)")
_GH_FILE = re.compile(r"https?://github\.com/([^/\s]+/[^/\s#?]+)/blob/[^/\s]+/([^\s#?]+)")
_URL = re.compile(r"https?://[^\s#?)]+")
_PROGRAM = re.compile(r"[\w./-]+\.(?:cu|cpp|c|py)\b")  # the recorded program's source file


def source_key(source: str) -> str:
    """The one source a label's ``source`` names (see the module docstring)."""
    s = source.strip()
    m = _GH.search(s)
    if m:
        return f"github:{m.group(1).lower()}#{m.group(2)}"
    m = _GH_FILE.search(s)
    if m:
        return f"github:{m.group(1).lower()}:{m.group(2)}"
    if s.startswith("recorded"):
        if (
            "torchrun agents as separate nodes" in s or "-node gloo torchrun job" in s
        ):  # tests/corpus_multinode: one trainer, train_gloo.py
            return "recording:train_gloo.py"
        m = _PROGRAM.search(s)
        if m:  # tests/fixtures/device/scripts/rec_1gpu/…: one source per program, however it was run
            return "recording:" + m.group(0).rsplit("/", 1)[-1]
        # the program is named by the words after the host description: "…, 2026-12-01): a C++ program …"
        what = s.split("): ", 1)[-1] if "): " in s else s
        return "recording:" + re.split(r"[,(;]", what, maxsplit=1)[0].strip().lower()
    m = _URL.search(s)
    return m.group(0).rstrip("/.").lower() if m else s.lower()


class _Recording:
    """Mixin over ``Rules``: notes every rule of the list sections and data/peer.yaml that matches a line.

    Only the lookups are wrapped, in a subclass the bench builds: the production
    matchers run unchanged, and a rule shadowed by an earlier one is still noted.
    """

    hits: dict[str, set[str]]  # rule id -> the matched texts

    def _note(self, rid: str, text: str) -> None:
        self.hits.setdefault(rid, set()).add(text)

    def _list(self, sec: str, text: str) -> None:
        for k, p in enumerate(getattr(self, f"{sec}_pats")):
            if p.search(text) is not None:
                self._note(f"{sec}:{k}", text)

    def is_benign(self, text: str) -> bool:
        got = super().is_benign(text)  # type: ignore[misc]
        if got:
            self._list("benign", text)
        return got

    def is_serving(self, text: str) -> bool:
        got = super().is_serving(text)  # type: ignore[misc]
        if got:
            self._list("serving", text)
        return got

    def is_ready(self, text: str) -> bool:
        got = super().is_ready(text)  # type: ignore[misc]
        if got:
            self._list("ready", text)
        return got

    def is_waiting(self, text: str) -> bool:
        got = super().is_waiting(text)  # type: ignore[misc]
        if got:
            self._list("waiting", text)
        return got

    def is_run_start(self, text: str) -> bool:
        got = super().is_run_start(text)  # type: ignore[misc]
        if got:
            self._list("run_start", text)
        return got

    def peer_for(self, *texts: str) -> Any:
        got = super().peer_for(*texts)  # type: ignore[misc]
        if got is not None:
            for r in self.peer:  # type: ignore[attr-defined]
                if any(t and r.pat.search(t) is not None for t in texts):
                    self._note(f"peer:{r.kind}", " ".join(texts))
        return got

    def secondary_for(self, text: str, header: str | None = None) -> Any:
        got = super().secondary_for(text, header)  # type: ignore[misc]
        if got is not None:
            for r in self.secondary:  # type: ignore[attr-defined]
                probe = header if r.header else text
                if probe and r.pat.search(probe) is not None:
                    self._note(f"secondary:{r.kind}", f"{got[0].kind}\0{text}")
        return got


def _recording_rules(rules: Any) -> Any:
    from fleetdiag.analysis.rules import RULE_FIELDS

    cls = type("RecordingRules", (_Recording, type(rules)), {})
    rec = cls(**{f: list(getattr(rules, f)) for f in RULE_FIELDS})
    rec.hits = {}
    return rec


# Rules written in code (fleetdiag/analysis), by what shows that they decided a case: the kind of the
# decisive event (tracebacks.py), the cascade's named kinds and the reason's words (decide.py), and
# the normalisation steps (normalise.py). They cannot be disabled from outside, so "needed by" is n/a.
CODE_RULES = {
    "code:python traceback (Traceback … Type: message)": "the decisive line ends a Python traceback",
    "code:exception line without a traceback": "a `Type: message` line standing alone",
    "code:C++ terminate / what()": "`terminate called after throwing an instance of 'X'` with its what()",
    "code:Rust panic (thread … panicked at, message on the next line)": "a Rust thread's panic and its message",
    "code:error-level line": "an ERROR/FATAL line of no known shape (a weak cause)",
    "code:traceback without its final line": "a traceback cut before its exception line",
    "code:chained exception is a wrapper": "a later exception of a chain that began with a cause",
    "code:JVM chain: the last Caused by is the cause": "a JVM exception whose next `Caused by:` it wraps",
    "code:exception line with prose glued on": "a traceback's `Type，…` (a paste's full-width punctuation)",
    "code:bare exception restated by its chain": "a message-less exception re-raised with words",
    "code:wrapper quoting a missing cause": "only a wrapper quotes the error (promoted)",
    "code:launcher summary's other ranks": "torchelastic's Failures: entries before the Root Cause",
    "code:failures after a launcher restart": "the errors of workers restarted after the first failure",
    "code:survived error (the process went on)": "an error followed by normal work or served requests",
    "code:launcher-only answer": "a launcher's report when the log holds nothing it wraps",
    "code:health probes are not progress": "`GET /health 200` after an error does not make it survived",
    "code:normalise: service prefix removed": "a log service's timestamp and severity on every line",
    "code:normalise: newest-first order reversed": "an export printed newest first",
    "code:normalise: re-wrapped lines joined": "lines a terminal, a paste or a console cut (or wrapped by words) at its width",
    "code:normalise: service column removed": "one docker compose service's column on every line",
    "code:normalise: line label removed": "a sidecar's, collector's or launcher's constant label on every line",
    "code:normalise: markdown removed": "a paste's fences, quotes, inline code, tags, bold or elisions",
    "code:normalise: relayed message unfolded": "a quoted message's escaped newlines, a native record inside a message",
    "code:normalise: log viewer's line chrome removed": "a web log viewer's line chrome between the lines",
    "code:front end answers only errors": "the last requests all answered 5xx and none served: stalled",
    "code:a relay's INFO is not the child's level": "a traceback relayed line by line at INFO: the lines' own words decide",
    "code:error recurred, last": "an error the process went on from and then hit again as the last it did",
    "code:anyhow chain: the innermost cause": "Rust's `Error: …` / `Caused by:` / indented causes, innermost last",
    "code:generic error over its detail line": "a `detailed` signature's line wrapping the detail under it (CANN's EE/EL)",
    "code:[Component] label is the process": "a front end's `[Name] ` label before the line it relays",
}

# Kernel evidence (evidence/correlate.py) by class; the Xid codes are the classes' data (data/xid.yaml,
# from NVIDIA's Xid catalog). A class fires on a kernel case whose verdict it decided: the decisive
# kernel line of a degraded host, or (for the classes that never stand alone) a line of that class in
# the kernel log of a host rightly left healthy.
KERNEL_RULES = {
    "kernel:Xid of class hardware stands alone": "",
    "kernel:Xid of class driver stands alone": "",
    "kernel:Xid of class application never stands alone": "",
    "kernel:Xid of class informational never stands alone": "",
    "kernel:GPU off the bus / lost stands alone": "",
    "kernel:adapter failed to initialise stands alone": "",
    "kernel:GSP timeout or error stands alone": "",
    "kernel:fatal AER on a GPU's path stands alone": "",
    "kernel:fatal NVSwitch SXid stands alone": "",
    "kernel:OOM kill, segfault, hung task, corrected errors never stand alone": "",
    "kernel:an Xid with a pid or name correlates to the process": "",
}
_KERNEL_KIND = {
    "gpu-lost": "kernel:GPU off the bus / lost stands alone",
    "gpu-init": "kernel:adapter failed to initialise stands alone",
    "gsp": "kernel:GSP timeout or error stands alone",
    "pcie-aer": "kernel:fatal AER on a GPU's path stands alone",
    "pcie-aer-detail": "kernel:fatal AER on a GPU's path stands alone",
    "sxid": "kernel:fatal NVSwitch SXid stands alone",
}
_NOT_ALONE = ("oom-kill", "oom-killed", "oom-reaped", "oom-invoke", "segfault", "gpf", "hung-task", "pcie-aer", "ecc")


def _in_process(rules: Any) -> Callable[[Case, str], Answer]:
    from fleetdiag.analysis import analyze_text

    def run(case: Case, text: str) -> Answer:
        d = analyze_text(text, rules=rules)
        dec = d.decisive
        return str(d.verdict), dec.line if dec else None, dec.role if dec else None, dec.category if dec else None

    return run


def _texts_of(rule_id: str, rules: Any) -> Iterable[str] | None:
    """Literal strings one of which a line must hold for the rule to match (None: unknown)."""
    sec, _, key = rule_id.partition(":")
    pats: list[Any] = []
    if sec == "signature":
        pats = [s.pat for s in rules.signatures if s.name == key]
    elif sec in ("secondary", "peer"):
        pats = [r.pat for r in getattr(rules, sec) if r.kind == key]
    else:
        return None
    nd: list[str] = []
    for p in pats:
        if p.needles is None:
            return None
        nd.extend(p.needles)
    return nd


def _code_fired(text: str, d: Any, rules: Any) -> set[str]:
    """The code rules that decided this diagnosis (see CODE_RULES)."""
    from fleetdiag.analysis import decide
    from fleetdiag.analysis.lines import parse_all, split_text
    from fleetdiag.analysis.normalise import normalise
    from fleetdiag.analysis.tracebacks import CAUSES_HEAD, GLUED_EXC, JVM_CAUSE, PANIC, build_events

    out: set[str] = set()
    norm = normalise(split_text(text))
    for step in norm.steps:
        out.add("code:normalise: re-wrapped lines joined" if "re-wrapped" in step else f"code:normalise: {step}")
    sec = d.secondary or {}
    if decide.OTHER_RANKS in sec:
        out.add("code:launcher summary's other ranks")
    if decide.RESTATED in sec:
        out.add("code:bare exception restated by its chain")
    if decide.RESTARTED in sec:
        out.add("code:failures after a launcher restart")
    if decide.SURVIVED in sec or "handled errors" in d.summary or "request errors" in d.summary:
        out.add("code:survived error (the process went on)")
    if "front end answers only errors" in d.summary:
        out.add("code:front end answers only errors")
    dec = d.decisive
    if dec is None:
        return out
    reason = dec.reason or ""
    if "only line quoting its error" in reason:
        out.add("code:wrapper quoting a missing cause")
    if dec.role == "launcher" and "wrote no error" in reason:
        out.add("code:launcher-only answer")
    run = decide.current_lines(parse_all(norm.lines, rules.tag_peelers), rules)
    events = build_events(run, rules)
    judged = decide.classify(events, rules, decide.summary_other_failures(run))
    mine = [j for j in judged if j.ev.line.msg.strip() == dec.message]
    if mine:
        ev = mine[0].ev
        if ev.kind == "exception":
            tb = any(_opens_traceback(ln.msg) for ln in ev.block)
            out.add(
                "code:python traceback (Traceback … Type: message)" if tb else "code:exception line without a traceback"
            )
        elif ev.kind == "native" and ev.block and PANIC.match(ev.block[0].msg.strip()):
            out.add("code:Rust panic (thread … panicked at, message on the next line)")
        elif ev.kind == "native":
            out.add("code:C++ terminate / what()")
        elif ev.kind == "error":
            out.add("code:error-level line")
        elif ev.kind == "incomplete":
            out.add("code:traceback without its final line")
        after = False
        for ln in run:
            if ln.index == ev.line.index:
                after = True
            elif after and decide.is_probe(ln.msg):
                out.add("code:health probes are not progress")
                break
    if any(
        j.ev.kind == "exception" and j.ev.chain > 0 and j.line_role == "wrapper" and j.rule is None and j.cause is None
        for j in judged
    ):
        out.add("code:chained exception is a wrapper")
    if dec.message.lstrip().startswith(JVM_CAUSE) and any(
        j.ev.kind == "exception" and j.line_role == "wrapper" and j.ev.line.index < dec_index(judged, dec)
        for j in judged
    ):
        out.add("code:JVM chain: the last Caused by is the cause")
    if mine and mine[0].ev.kind == "exception" and GLUED_EXC.match(dec.message.strip()):
        out.add("code:exception line with prose glued on")
    if any(ln.relayed and ln.level is None and ln.msg.startswith("Traceback (most recent call last)") for ln in run):
        out.add("code:a relay's INFO is not the child's level")
    if "failed the same way again" in reason:
        out.add("code:error recurred, last")
    if mine and any(ln.msg.strip() == CAUSES_HEAD for ln in mine[0].ev.block):
        out.add("code:anyhow chain: the innermost cause")
    if any(j.line_role == "wrapper" and j.sig is not None and j.sig.detailed for j in judged):
        out.add("code:generic error over its detail line")
    if dec.process and dec.line.lstrip().startswith(f"[{dec.process}] "):
        out.add("code:[Component] label is the process")
    return out


def dec_index(judged: list[Any], dec: Any) -> int:
    """The line index of the decisive line among the judged events (its first event)."""
    return next((j.ev.line.index for j in judged if j.ev.line.msg.strip() == dec.message), -1)


def _opens_traceback(msg: str) -> bool:
    from fleetdiag.analysis.tracebacks import TB_START

    return "Traceback" in msg and TB_START.search(msg) is not None


def _gave_decisive_role(hit: str, d: Any, rules: Any) -> bool:
    """A secondary rule whose role the decisive line carries: a wrapper promoted because only it quotes the
    cause keeps the wrapper role, while its signature comes from the quoted message."""
    kind, _, text = hit.partition("\0")
    dec = d.decisive
    if dec is None or text.strip() != (dec.message or "").strip():
        return False
    return any(r.kind == kind and r.role == dec.role for r in rules.secondary)


def fires_on(cases: list[Case], rules: Any, base: dict[str, str], texts: dict[str, str]) -> dict[str, set[str]]:
    """{rule id: ids of the right cases where the rule matched a line the decision used}.

    signature: the decisive line's rule, or one whose role demoted a line the decision counted (a
    wrapper's or a consequence's kind in the cascade). secondary: it gave a role to the decisive line or to a line the
    decision demoted (its kind names the decisive line or a counted cascade entry; a rule shadowed on the
    same line by the one that gave the role counts too). peer: it made an error line peer-caused, or it
    is the kind the job analysis (fleetdiag.job.classify, the same data/peer.yaml) gives the decisive line.
    benign, serving: it matched an error line (benign) or a request after an error (serving): both decide
    what survives. ready, waiting: it matched a line of a case whose verdict comes from them (healthy,
    starting) or whose errors were survived. run_start: it matched a banner after the log's first line
    (it scoped the analysis to the latest run). code: see CODE_RULES.
    """
    from fleetdiag.analysis import analyze_text
    from fleetdiag.analysis.decide import SURVIVED
    from fleetdiag.job.rules import load_job_rules

    job_rules = load_job_rules(user_default=False)
    out: dict[str, set[str]] = defaultdict(set)
    sig_names = {getattr(sg, "name", None) for sg in rules.signatures}
    for c in cases:
        if base.get(c.id) != RIGHT:
            continue
        rec = _recording_rules(rules)
        d = analyze_text(texts[c.id], rules=rec)
        used = set(d.secondary or {})
        if d.decisive is not None and d.decisive.rule:
            out[f"signature:{d.decisive.rule}"].add(c.id)
            used.add(d.decisive.rule)
        for kind in used & sig_names:  # a signature whose role demoted a line the decision counted
            out[f"signature:{kind}"].add(c.id)
        survived = SURVIVED in (d.secondary or {}) or any(
            k in (d.summary or "") for k in ("handled errors", "request errors")
        )
        first_line = texts[c.id].split("\n", 1)[0]
        for rid, hit in rec.hits.items():
            sec = rid.split(":", 1)[0]
            if sec == "secondary":
                if any(h.split("\0", 1)[0] in used or _gave_decisive_role(h, d, rules) for h in hit):
                    out[rid].add(c.id)
            elif sec in ("peer", "benign", "serving"):
                out[rid].add(c.id)
            elif sec in ("ready", "waiting"):
                if str(d.verdict) != "failed" or survived:
                    out[rid].add(c.id)
            elif sec == "run_start":
                if any(h.strip() and h.strip() not in first_line for h in hit):
                    out[rid].add(c.id)
        if d.decisive is not None:  # the job analysis's kind for this host's line (fleetdiag.job.classify)
            said = [d.decisive.line, d.decisive.message, *d.decisive.traceback[-12:]]
            kind = next((r.key for r in job_rules.peer_caused if any(t and r.regex.search(t) for t in said)), None)
            if kind is not None:
                out[f"peer:{kind}"].add(c.id)
        for rid in _code_fired(texts[c.id], d, rules):
            out[rid].add(c.id)
    out.pop("signature:None", None)
    return out


def _kernel_fired(cases: list[Case]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Kernel classes and Xid codes that decided the kernel cases (through ``analyze --kernel``)."""
    classes: dict[str, set[str]] = defaultdict(set)
    codes: dict[str, set[str]] = defaultdict(set)
    if not cases or not _kernel_supported():
        return classes, codes
    from fleetdiag.evidence import xid as xid_mod

    table = xid_mod.default_xid_table()
    raw: dict[str, dict[str, Any]] = {}
    got = run_cli(cases, raw=raw)
    for c in cases:
        if c.id not in got or judge(c, *got[c.id]) != RIGHT:
            continue
        data = raw[c.id]
        evs = [e for e in data.get("evidence") or [] if e.get("source") == "kernel"]
        dec = data.get("decisive") or {}
        if data.get("verdict") == "degraded" and dec.get("source") == "kernel":
            hit = next((e for e in evs if e.get("line") == dec.get("line")), None)
            if hit is None:
                continue
            if hit.get("kind") == "xid":
                code = hit.get("code")
                codes[f"xid:{code}"].add(c.id)
                # Xid 154 takes the class of the recovery it asks for (evidence/correlate.py): a reset or a
                # reboot is driver, a drain hardware, as the card's category says
                action = (dec.get("category") or "driver") if code == 154 else table.get(code).action
                cls = f"kernel:Xid of class {action} stands alone"
                classes[cls].add(c.id)
            elif hit.get("kind") in _KERNEL_KIND:
                classes[_KERNEL_KIND[hit["kind"]]].add(c.id)
        elif data.get("verdict") == "healthy":
            for e in evs:
                if e.get("kind") == "xid":
                    action = table.get(e.get("code")).action
                    if action in ("application", "informational"):
                        classes[f"kernel:Xid of class {action} never stands alone"].add(c.id)
                        codes[f"xid:{e.get('code')}"].add(c.id)
                elif e.get("kind") in _NOT_ALONE:
                    classes["kernel:OOM kill, segfault, hung task, corrected errors never stand alone"].add(c.id)
    paired = [c for c in cases if c.app is not None and c.kernel_line]
    raw = {}
    run_cli(paired, raw=raw, app=True)
    for c in paired:
        dec = (raw.get(c.id) or {}).get("decisive") or {}
        if dec.get("source") == "kernel" and dec.get("consequence") and c.kernel_line in (dec.get("line") or ""):
            classes["kernel:an Xid with a pid or name correlates to the process"].add(c.id)
            m = re.search(r"Xid \([^)]*\): (\d+)", dec.get("line") or "")
            if m:
                codes[f"xid:{m.group(1)}"].add(c.id)
    return classes, codes


def rule_support(cases: list[Case]) -> dict[str, dict[str, list[str]]]:
    """{rule id: {"fires": case ids, "needed": case ids or None}} for every rule, code and kernel class,
    and every Xid code (``xid:N``, the kernel classes' data); in-process analysis of whole logs."""
    from fleetdiag.analysis import load_rules
    from fleetdiag.evidence import xid as xid_mod

    rules = load_rules(user_default=False)
    texts = {c.id: c.log.read_text(encoding="utf-8", errors="replace") for c in cases if c.kernel is None}
    live = [c for c in cases if c.kernel is None]
    base_run = _in_process(rules)
    base = {c.id: judge(c, *base_run(c, texts[c.id])) for c in live}
    fired = fires_on(live, rules, base, texts)
    kcases = [c for c in cases if c.kernel is not None]
    kclasses, kcodes = _kernel_fired(kcases)
    out: dict[str, dict[str, Any]] = {}
    for rid in rules.rule_ids():
        needles = _texts_of(rid, rules)
        cand = [c for c in live if base[c.id] == RIGHT]
        if needles is not None:
            cand = [c for c in cand if any(n in texts[c.id] for n in needles)]
        needed: list[str] = []
        if cand:
            run = _in_process(rules.without(rid))
            needed = [c.id for c in cand if judge(c, *run(c, texts[c.id])) != RIGHT]
        out[rid] = {"fires": sorted(fired.get(rid, ())), "needed": needed}
    for rid in CODE_RULES:
        out[rid] = {"fires": sorted(fired.get(rid, ())), "needed": None}
    xneeded = _xid_support(kcases)
    table = xid_mod.default_xid_table()
    for rid in KERNEL_RULES:
        need: set[str] = set()
        for code, ids in xneeded.items():
            # Xid 154's data says informational; the cases that need it ask for a reset or a reboot (driver)
            action = "driver" if code == "xid:154" else table.get(int(code.split(":")[1])).action
            if rid.startswith(f"kernel:Xid of class {action} "):
                need.update(ids)
        is_xid_class = rid.startswith("kernel:Xid")
        out[rid] = {"fires": sorted(kclasses.get(rid, ())), "needed": sorted(need) if is_xid_class else None}
    for code in sorted(table.codes):
        rid = f"xid:{code}"
        out[rid] = {"fires": sorted(kcodes.get(rid, ())), "needed": xneeded.get(rid, [])}
    return out


def _xid_support(cases: list[Case]) -> dict[str, list[str]]:
    """data/xid.yaml codes on the kernel set, when ``analyze --kernel`` exists (else nothing)."""
    if not cases or not _kernel_supported():
        return {}
    try:
        from fleetdiag.evidence import xid as xid_mod
    except ImportError:
        return {}
    table = xid_mod.default_xid_table()
    base = {c.id: judge(c, *run_cli([c])[c.id]) for c in cases}
    out: dict[str, list[str]] = {}
    for code in sorted(table.codes):
        named = re.compile(rf"Xid \([^)]*\): {code}\b")  # the cases whose kernel log names this Xid
        cand = [c for c in cases if base[c.id] == RIGHT and named.search(c.kernel.read_text(errors="replace"))]  # type: ignore[union-attr]
        flipped = []
        if cand:
            less = xid_mod.XidTable({k: v for k, v in table.codes.items() if k != code}, table.hints)
            # every module that imported the table's accessor by name gets the smaller table
            users = [
                m
                for m in list(sys.modules.values())
                if getattr(m, "__name__", "").startswith("fleetdiag")
                and getattr(m, "default_xid_table", None) is xid_mod.default_xid_table
            ]
            saved = xid_mod.default_xid_table
            for m in users:
                m.default_xid_table = lambda less=less: less  # type: ignore[attr-defined]
            try:
                got = run_cli(cand)
            finally:
                for m in users:
                    m.default_xid_table = saved  # type: ignore[attr-defined]
            flipped = [c.id for c in cand if judge(c, *got[c.id]) != RIGHT]
        out[f"xid:{code}"] = flipped
    return out


# ------------------------------------------------------------------ report


def bucket(n_sources: int) -> str:
    """A rule's support class by the sources of the cases it fires on: "0", "1" or ">=2"."""
    return "0" if n_sources == 0 else ("1" if n_sources == 1 else ">=2")


def report(subprocess_mode: bool = False, sweep: bool = True) -> dict[str, Any]:
    """The whole measurement as data (the test asserts on it; main prints it)."""
    sets = all_sets()
    every = [c for cs in sets.values() for c in cs]
    t0 = time.monotonic()
    got = run_cli(every, subprocess_mode)
    per_set: dict[str, dict[str, Any]] = {}
    for name, cases in sets.items():
        row = {"right": 0, "total": 0, "decoys": 0, "wrong": [], "skipped": 0}
        for c in cases:
            if c.id not in got:
                row["skipped"] += 1
                continue
            row["total"] += 1
            j = judge(c, *got[c.id])
            if j == RIGHT:
                row["right"] += 1
            else:
                row["wrong"].append(c.id)
                row["decoys"] += j == DECOY
        per_set[name] = row
    out: dict[str, Any] = {"sets": per_set, "cli_seconds": round(time.monotonic() - t0, 1)}
    if sweep:
        t1 = time.monotonic()
        sup = rule_support(every)
        src = {c.id: source_key(c.source) for c in every}
        rows = {}
        for rid, s in sup.items():
            fs = sorted({src[i] for i in s["fires"]})
            rows[rid] = {
                "fires": s["fires"],
                "needed": s["needed"],
                "sources": len(fs),
                "source_keys": fs,
                "needed_sources": None if s["needed"] is None else len({src[i] for i in s["needed"]}),
            }
        out["support"] = rows
        out["totals"] = totals(rows)
        out["sweep_seconds"] = round(time.monotonic() - t1, 1)
    return out


def totals(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Rules (every id but the Xid codes) and Xid codes, by fires-on sources: 0, 1, >=2."""
    out: dict[str, dict[str, int]] = {}
    for part, ids in (
        ("rules", [r for r in rows if not r.startswith("xid:")]),
        ("xid codes", [r for r in rows if r.startswith("xid:")]),
    ):
        t = {"total": len(ids), "0": 0, "1": 0, ">=2": 0}
        for r in ids:
            t[bucket(rows[r]["sources"])] += 1
        t["needed by >=2 sources"] = sum(1 for r in ids if (rows[r]["needed_sources"] or 0) >= 2)
        out[part] = t
    return out


def _print(res: dict[str, Any]) -> None:
    print(f"{'set':<26} {'right':>5} / {'total':<5} {'decoys':>6}")
    for name, row in res["sets"].items():
        extra = f"  ({row['skipped']} not run: analyze has no --kernel)" if row["skipped"] else ""
        print(f"{name:<26} {row['right']:>5} / {row['total']:<5} {row['decoys']:>6}{extra}")
        for w in row["wrong"]:
            print(f"{'':<28}wrong: {w}")
    print(f"(through `fleetdiag analyze --json`: {res['cli_seconds']} s)")
    sup = res.get("support")
    if sup is None:
        return
    print()
    print("rule support: fires = right cases where the rule matched a line the decision used (src = their sources);")
    print("needed = cases that turn wrong with the rule disabled (- : a rule in code, cannot be disabled)")
    print(f"  {'fires':>5} {'src':>3} {'needed':>6}  rule")
    for rid, s in sorted(sup.items(), key=lambda kv: (kv[0].startswith("xid:"), kv[0])):
        need = "-" if s["needed"] is None else str(len(s["needed"]))
        flag = "" if s["sources"] >= 2 else ("  <- one source" if s["sources"] == 1 else "  <- fires on no case")
        ids = ", ".join(s["fires"][:3]) + (" …" if len(s["fires"]) > 3 else "")
        print(f"  {len(s['fires']):>5} {s['sources']:>3} {need:>6}  {rid:<58}{flag}  {ids}")
    t = res["totals"]
    r, x = t["rules"], t["xid codes"]
    print(
        f"totals: {r['total']} rules; fires on cases from 0 sources: {r['0']}, from 1 source: {r['1']}, "
        f"from >=2 sources: {r['>=2']} (needed by >=2 sources: {r['needed by >=2 sources']}); "
        f"Xid codes (data): {x['total']}, 0: {x['0']}, 1: {x['1']}, >=2: {x['>=2']} (sweep {res['sweep_seconds']} s)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subprocess", action="store_true", help="one `fleetdiag analyze` process per case")
    ap.add_argument("--no-sweep", action="store_true", help="skip the rule-support sweep")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    res = report(args.subprocess, not args.no_sweep)
    _print(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
