"""Which node broke the job, on every recorded multi-node job, end to end through ``fleetdiag probe`` over a real sshd.

Every case of ``shared/corpus/multinode`` (NCCL, 2 nodes), ``tests/fixtures/gloo`` (gloo, 2–4 nodes, recorded on
the CPU machine) and ``tests/corpus_multinode`` (gloo, 3–8 nodes, recorded on the GPU host) lies in ONE
inventory: each node's log on its own host (127.0.0.1, the session sshd, its own folder), each case moved to its
own hour so that cases never share a window, the hosts of each case in a rotated order. The torchelastic error
files the logs name lie where the log says (the path rewritten into the host's folder), and the Flight Recorder
dumps under the prefix the inventory gives (``funnel.flight_recorder``). One probe names every root; a second,
with every host's clock 30 s ahead or behind (a stand-in ``date`` and logs written by that clock), names the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.cli import main

from .test_job import MULTI, shift

HERE = Path(__file__).resolve().parent
GLOO = HERE / "fixtures" / "gloo"
DEVICE = HERE / "corpus_multinode"
_ERRFILE = re.compile(r"(error_file: *)(/\S+\.json)")


@dataclass
class Case:
    id: str
    base: Path
    label: dict
    errfiles: dict[str, Path] = field(default_factory=dict)  # host -> its error file
    fr: dict[str, list[Path]] = field(default_factory=dict)  # host -> its Flight Recorder dumps

    @property
    def hosts(self) -> list[str]:
        return sorted(self.label["logs"])


def cases() -> list[Case]:
    """Every labelled case whose logs decide it (a live hang's logs do not: tests below use its stacks)."""
    out: list[Case] = []
    for base in (MULTI, GLOO, DEVICE):
        for p in sorted(base.glob("*.json")):
            lab = json.loads(p.read_text())
            if "root_host" not in lab or not lab.get("victims"):
                continue
            c = Case(lab["id"], base, lab)
            ev = lab.get("evidence") or {}
            for h, f in (ev.get("errorfiles") or {}).items():
                c.errfiles[h] = base / f
            for h, f in lab["logs"].items():
                mine = base / f.replace(".log", ".error.json")
                if base == GLOO and mine.is_file():
                    c.errfiles[h] = mine
            if base == GLOO and (base / f"{c.id}.fr_rank_0").is_file():
                for h in c.hosts:  # node R ran rank R
                    c.fr[h] = [base / f"{c.id}.fr_rank_{h[-1]}"]
            for name, f in (ev.get("fr_dumps") or {}).items():
                m = re.match(r"dump_fr_trace_\w+_rank(\d+)$", name)
                if m and f.endswith(".pkl"):  # the pickle torch's _dump_fr_trace wrote (the JSON form: a unit test)
                    c.fr.setdefault(f"node{m.group(1)}", []).append(base / f)
            out.append(c)
    return out


CASES = cases()
KINDS = {c.id: c.label.get("kind") or "exception" for c in CASES}


STANDINS = HERE / "standins_kernel"


def skewed_date(bindir: Path) -> Path:
    """A stand-in ``date``: +30 s on a host whose log path has ``/ahead/``, −30 s on ``/behind/``; and a
    ``dmesg`` serving the host's recorded kernel log (``kern.log`` beside its log; none: an empty one)."""
    bindir.mkdir(parents=True, exist_ok=True)
    for tool, mode in (("dmesg", "dmesg"), ("journalctl", "dmesg")):
        exe = bindir / tool
        exe.write_text(
            "#!/bin/sh\n"
            'k="${FD_LOG%/*}/kern.log"; [ -f "$k" ] || k=/dev/null\n'
            f"FD_STANDIN_MODE={mode}; FD_STANDIN_KERN=$k; export FD_STANDIN_MODE FD_STANDIN_KERN\n"
            f"exec '{STANDINS / tool}' \"$@\"\n"
        )
        exe.chmod(0o755)
    real = "/bin/date" if os.path.exists("/bin/date") else "/usr/bin/date"
    exe = bindir / "date"
    exe.write_text(
        "#!/bin/sh\n"
        'case "$FD_LOG" in */ahead/*) d=30 ;; */behind/*) d=-30 ;; *) d=0 ;; esac\n'
        f"now=$({real} +%s.%N); s=${{now%.*}}; n=${{now#*.}}\n"
        f'exec {real} -d "@$((s + d)).$n" "$@"\n'
    )
    exe.chmod(0o755)
    return bindir


def skew_cases() -> list[Case]:
    """The skewed run: one case of each kind and both pairs of jobs at once (the load stays small)."""
    seen: set[str] = set()
    out = []
    for c in CASES:
        kind = KINDS[c.id]
        if kind not in seen or c.id in ("g3_twoA", "g2_twoB", "two_jobs_a", "two_jobs_b", "fr_gloo"):
            seen.add(kind)
            out.append(c)
    return out


def lay_out(sshd, root: Path, skew: bool, which: list[Case] | None = None) -> tuple[Path, dict[str, tuple[Case, str]]]:
    """One inventory with every case: host name -> (case, node)."""
    lines = ["hosts:"]
    where: dict[str, tuple[Case, str]] = {}
    for c in which or CASES:
        k = CASES.index(c)  # the case's own hour, the same in every run
        r = (k + skew) % len(c.hosts)
        hosts = c.hosts[r:] + c.hosts[:r]  # rotated orders
        for j, node in enumerate(hosts):
            d = (30.0 if j % 2 == 0 else -30.0) if skew else 0.0
            name = f"{c.id}.{node}"
            hdir = root / ("ahead" if d > 0 else "behind" if d < 0 else "insync") / name
            hdir.mkdir(parents=True)
            move = k * 3600.0 + d  # the case's own hour, and the host's clock
            text = shift((c.base / c.label["logs"][node]).read_text(), move)
            if node in c.errfiles:
                doc = json.loads(c.errfiles[node].read_text())
                info = (doc.get("message") or {}).get("extraInfo") or {}
                if str(info.get("timestamp", "")).isdigit():
                    info["timestamp"] = str(int(info["timestamp"]) + int(move))
                paths = dict.fromkeys(m.group(2) for m in _ERRFILE.finditer(text))
                for i, p in enumerate(paths):
                    mine = hdir / "torchelastic" / str(i) / "error.json"
                    mine.parent.mkdir(parents=True)
                    mine.write_text(json.dumps(doc))
                    text = text.replace(p, str(mine))
            log = hdir / "train.log"
            log.write_text(text)
            kern = (c.label.get("evidence") or {}).get("kernel") or {}
            if node in kern:
                shutil.copy(c.base / kern[node], hdir / "kern.log")
            fr = ""
            if c.fr.get(node):
                (hdir / "fr").mkdir()
                for f in c.fr[node]:  # where torch writes them: PREFIX<rank>
                    shutil.copy(f, hdir / "fr" / f"nccl_trace_rank_{node[-1]}")
                fr = f"      flight_recorder: {json.dumps(str(hdir / 'fr' / 'nccl_trace_rank_'))}\n"
            lines += [
                f"  {name}:",
                "    address: 127.0.0.1",
                f"    port: {sshd.port}",
                f"    user: {sshd.user}",
                "    logs:",
                f"      train: {json.dumps(str(log))}",
            ]
            if fr:
                lines += ["    funnel:", fr.rstrip("\n")]
            where[name] = (c, node)
    inv = root / "inventory.yaml"
    inv.write_text("\n".join(lines) + "\n")
    return inv, where


def probe(sshd, inv: Path, *extra: str) -> tuple[int, str]:
    r = CliRunner().invoke(
        main,
        [
            "-i",
            str(inv),
            "probe",
            "all",
            *extra,
            "--no-stacks",
            *sshd.cli_args(),
        ],
    )
    return r.exit_code, r.output


def score(doc: dict, where: dict[str, tuple[Case, str]]) -> dict[str, list[str]]:
    """Per case: what is wrong with its root cause ([] when it is right)."""
    by_case: dict[str, list[dict]] = {}
    for rc in doc["root_causes"]:
        by_case.setdefault(where[rc["host"]][0].id, []).append(rc)
    out: dict[str, list[str]] = {}
    for c in {id(c): c for c, _ in where.values()}.values():
        bad: list[str] = []
        got = by_case.get(c.id, [])
        if len(got) != 1:
            out[c.id] = [f"{len(got)} root causes"]
            continue
        rc = got[0]
        lab = c.label
        if rc["host"] != f"{c.id}.{lab['root_host']}" or rc["rank"] != lab["root_rank"]:
            bad.append(f"root {rc['host']} rank {rc['rank']}")
        if not any(s in rc["line"] for s in lab["root_line_any"]):
            bad.append(f"line {rc['line'][:100]!r}")
        if sorted(rc["affected"]) != sorted(f"{c.id}.{h}" for h in c.hosts if h != lab["root_host"]):
            bad.append(f"affected {rc['affected']}")
        if not re.search(r"ranks \d", rc["formed"]):
            bad.append(f"formed {rc['formed']!r}")
        out[c.id] = bad
    return out


@pytest.fixture(scope="module")
def fleet(sshd, tmp_path_factory):
    """The two probes of the whole corpus (in sync, then skewed): their JSON and host maps."""
    runs = {}
    for skew in (False, True):
        root = tmp_path_factory.mktemp("skew" if skew else "sync")
        inv, where = lay_out(sshd, root, skew, skew_cases() if skew else None)
        extra = ["--path-prepend", str(skewed_date(root / "bin"))]  # in sync: no /ahead/ or /behind/ in a path
        code, out = probe(sshd, inv, "--json", "--fanout", "8", "--timeout", "120", *extra)
        assert code == 1, out[-2000:]
        runs[skew] = (json.loads(out), where)
        if os.environ.get("FD_JOB_DUMP"):
            Path(os.environ["FD_JOB_DUMP"] + f".{int(skew)}.json").write_text(out)
    return runs


def test_every_recorded_job_names_its_root_node_and_rank(fleet) -> None:
    assert len(CASES) >= 20, [c.id for c in CASES]
    doc, where = fleet[False]
    wrong = {k: v for k, v in score(doc, where).items() if v}
    tally: dict[str, list[int]] = {}
    for c in CASES:
        t = tally.setdefault(KINDS[c.id], [0, 0])
        t[0] += c.id not in wrong
        t[1] += 1
    print("right/total per kind:", {k: f"{a}/{b}" for k, (a, b) in sorted(tally.items())})
    assert not wrong, wrong
    assert len(doc["root_causes"]) == len(CASES)  # no false job between cases, none split


def test_clock_skew_30s_either_way_names_the_same_roots(fleet) -> None:
    doc, where = fleet[True]
    for h in doc["hosts"]:
        d = 30.0 if "/ahead/" in h["log"] else -30.0
        assert h["facts"]["clock"]["offset"] == pytest.approx(-d, abs=2), (h["host"], h["facts"]["clock"])
    wrong = {k: v for k, v in score(doc, where).items() if v}
    assert not wrong, wrong
    assert len(doc["root_causes"]) == len(skew_cases())
    plain = {rc["host"]: rc["time"] for rc in fleet[False][0]["root_causes"]}
    for rc in doc["root_causes"]:  # corrected back onto the local clock
        t = datetime.fromisoformat(rc["time"].replace("Z", "+00:00")).timestamp()
        t0 = datetime.fromisoformat(plain[rc["host"]].replace("Z", "+00:00")).timestamp()
        assert abs(t - t0) < 2.5, (rc["host"], rc["time"], plain[rc["host"]])


def test_two_jobs_at_once_are_two_root_causes(fleet) -> None:
    doc, where = fleet[False]
    for a, b in (("g3_twoA", "g2_twoB"), ("two_jobs_a", "two_jobs_b")):
        rcs = {where[rc["host"]][0].id: rc for rc in doc["root_causes"] if where[rc["host"]][0].id in (a, b)}
        assert set(rcs) == {a, b}
        assert not set(rcs[a]["affected"]) & set(rcs[b]["affected"])


def test_signal_deaths_name_the_signal_and_the_kernel_log(fleet) -> None:
    doc, where = fleet[False]
    rc = next(rc for rc in doc["root_causes"] if where[rc["host"]][0].id == "host_oom")
    assert "the kernel: " in rc["why"] and "Killed process 666" in rc["why"], rc["why"]
    for rc in doc["root_causes"]:
        c, _ = where[rc["host"]]
        if re.search(r"exitcode: -(9|11)\b", rc["line"]) and KINDS[c.id] != "native":
            assert re.search(r"died by SIG(KILL|SEGV) with no error of its own", rc["why"]), rc["why"]
            assert "kernel log" in rc["why"] or "the kernel:" in rc["why"], rc["why"]


def test_error_files_and_flight_recorder_on_the_record(fleet) -> None:
    doc, where = fleet[False]
    hosts = {h["host"]: h for h in doc["hosts"]}
    rcs = {where[rc["host"]][0].id: rc for rc in doc["root_causes"]}
    # a root whose rank ran under @record: its error file is on the job's record, with its message and time
    for cid, want in (("errorfile", "ValueError: malformed record 7"), ("g3_exc_mid", "RuntimeError: mat1 and mat2")):
        (ev,) = [e for e in rcs[cid]["evidence"] if e.startswith("error file ")]
        assert want in ev and " (at 20" in ev, ev
        node = hosts[rcs[cid]["host"]]["facts"]["node"]
        (ef,) = {e["message"] for e in node["error_files"]}
        assert want in ef
    # the Flight Recorder dumps: which ranks' were found, and the straggler they name
    for cid, ranks, straggler in (("g3_hang", "0–2", 1), ("fr_gloo", "0–2", 2)):
        rc = rcs[cid]
        assert f"Flight Recorder dumps found for ranks {ranks}" in rc["evidence"], rc["evidence"]
        assert rc["rank"] == straggler and "Flight Recorder dumps" in rc["why"], rc["why"]
        dumps = [
            d for h in hosts.values() if where[h["host"]][0].id == cid for d in h["facts"]["node"]["flight_recorder"]
        ]
        assert sorted(d["rank"] for d in dumps) == [0, 1, 2] and all(d["format"] == "pickle" for d in dumps)
        behind = [d for d in dumps if d["rank"] == straggler]
        assert behind[0]["last_enqueued"] < max(d["last_enqueued"] for d in dumps)


def test_the_card_shows_the_job_line_error_file_and_flight_recorder(sshd, tmp_path) -> None:
    """The text a person reads: the job line with root host and rank and how the job was formed, the root's
    error file and the Flight Recorder dumps under it, the root's card."""
    inv, _ = lay_out(sshd, tmp_path, False, [c for c in CASES if c.id in ("g3_hang", "errorfile")])
    code, out = probe(sshd, inv)
    assert code == 1, out
    flat = " ".join(out.split())
    assert "job root cause: g3_hang.node1 · rank 1 · straggler: rank 1 never reached the collective" in flat, flat
    assert "job: ranks 0–2 of 3" in flat
    assert "Flight Recorder dumps found for ranks 0–2" in flat
    assert "job root cause: errorfile.node5 · rank 5 · ValueError: malformed record 7" in flat
    assert "job: ranks 0–7 of 8" in flat and "7 other hosts failed as a consequence" in flat
    assert "error file " in flat and "malformed record 7 in shard 5" in flat
    assert "flight rec." in out and "enqueued #5" in flat  # the straggler's card: its own dump
    assert "job procs" not in out  # no process of these jobs lives on the host
