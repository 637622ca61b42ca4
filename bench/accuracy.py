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
verdict is the labelled one; *decoy* when it names a decoy instead.

Sets: shared/corpus/dev, shared/corpus/kernel (the app log with
``--kernel``, when ``analyze`` has it), shared/corpus/multinode and
tests/corpus_multinode (per node: the root node's own error; a victim's line
must be marked ``peer-caused``), tests/corpus, tests/corpus_extra,
tests/corpus_heldout.

Part 2, **rule support**, in-process (``analyze_text`` on the whole log, no
funnel, for speed): for each rule id (``Rules.rule_ids``: signatures,
secondary rules, data/peer.yaml's peer_caused kinds, benign/serving/ready/
waiting/run_start entries, and data/xid.yaml codes on the kernel set) the cases
whose judgement flips from right to wrong when that one rule is disabled.
A rule no case needs is listed as 0; a rule only one case (one source) needs
is flagged.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
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
            )
        )
    return out


def all_sets() -> dict[str, list[Case]]:
    """Every corpus present on this machine, by set name."""
    sets: dict[str, list[Case]] = {}
    for name, folder, fn in (
        ("dev", SHARED / "corpus" / "dev", single_host_set),
        ("kernel", SHARED / "corpus" / "kernel", kernel_set),
        ("tests/corpus_kernel_extra", TESTS / "corpus_kernel_extra", kernel_set),
        ("multinode", SHARED / "corpus" / "multinode", multinode_set),
        ("tests/corpus", TESTS / "corpus", single_host_set),
        ("tests/corpus_extra", TESTS / "corpus_extra", single_host_set),
        ("tests/corpus_heldout", TESTS / "corpus_heldout", single_host_set),
        ("tests/corpus_heldout/kernel", TESTS / "corpus_heldout" / "kernel", kernel_set),
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


def run_cli(cases: list[Case], subprocess_mode: bool = False) -> dict[str, Answer]:
    """Each case through ``fleetdiag analyze --json``: {id: (verdict, decisive line, role)}."""
    from click.testing import CliRunner

    from fleetdiag.cli import main

    kernel_ok = _kernel_supported()
    runner = CliRunner()
    out: dict[str, Answer] = {}
    env = {**os.environ, "XDG_CONFIG_HOME": os.devnull}  # never the user's own rules
    for c in cases:
        argv = _argv(c, kernel_ok)
        if argv is None:
            continue
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
            continue
        if isinstance(data, dict) and "hosts" in data:
            data = data["hosts"][0]
        dec = data.get("decisive") or {}
        out[c.id] = (data.get("verdict"), dec.get("line"), dec.get("role"), dec.get("category"))
    return out


# ------------------------------------------------------------------ part 2: rule support


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


def rule_support(cases: list[Case]) -> dict[str, list[str]]:
    """{rule id: ids of the cases that turn wrong without it}, in-process analysis of whole logs."""
    from fleetdiag.analysis import load_rules

    rules = load_rules(user_default=False)
    texts = {c.id: c.log.read_text(encoding="utf-8", errors="replace") for c in cases if c.kernel is None}
    live = [c for c in cases if c.kernel is None]
    base_run = _in_process(rules)
    base = {c.id: judge(c, *base_run(c, texts[c.id])) for c in live}
    support: dict[str, list[str]] = {}
    for rid in rules.rule_ids():
        needles = _texts_of(rid, rules)
        cand = [c for c in live if base[c.id] == RIGHT]
        if needles is not None:
            cand = [c for c in cand if any(n in texts[c.id] for n in needles)]
        if not cand:
            support[rid] = []
            continue
        run = _in_process(rules.without(rid))
        support[rid] = [c.id for c in cand if judge(c, *run(c, texts[c.id])) != RIGHT]
    support.update(_xid_support([c for c in cases if c.kernel is not None]))
    return support


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
        src = {c.id: c.source for c in every}
        out["support"] = {rid: {"cases": ids, "sources": len({src[i] for i in ids})} for rid, ids in sup.items()}
        out["sweep_seconds"] = round(time.monotonic() - t1, 1)
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
    print("rule support: cases that turn wrong when the rule is disabled (in-process analysis of whole logs)")
    buckets: dict[str, list[str]] = defaultdict(list)
    for rid, s in sorted(sup.items()):
        n = len(s["cases"])
        b = "0" if n == 0 else ("1" if n == 1 or s["sources"] < 2 else ">=2")
        buckets[b].append(rid)
        print(f"  {n:>3}  {rid:<60} {', '.join(s['cases'][:4])}{' …' if n > 4 else ''}")
    print(
        f"totals: {len(sup)} rules; {len(buckets['0'])} with 0 supporting cases, "
        f"{len(buckets['1'])} with 1 (or one source), {len(buckets['>=2'])} with >=2 from >=2 sources "
        f"(sweep {res['sweep_seconds']} s)"
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
