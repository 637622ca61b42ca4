"""The analyzer on a second, held-out set of real failure logs (tests/corpus_extra).

Same shape and labelling rules as tests/corpus (see tests/corpus/README.md):
each case is a verbatim window of a log from a public bug report plus its
label. These cases were collected to measure how the analyzer generalises
beyond the logs it was developed on, so fixes for them must be general rules
(line model, traceback rebuilding, classification, rules.yaml patterns), not
wording from one file.

A label for a log that did not fail carries ``"verdict"``: one of the verdicts
the analyzer gives such a log (``NOT_FAILED``: ``healthy``, ``starting``,
``stalled``), with ``decisive`` null and, optionally, ``summary_has`` (text the
summary must contain).

A label may carry ``"known_wrong": "<why>"`` when the analyzer is known to
get the case wrong; only those cases are expected to fail (strict xfail, so a
fix that makes them pass is noticed). Where only some checks fail (say the
line is right but the category is not), ``known_wrong`` is an object mapping
each failing test's name to its reason, and the other tests run normally.

Every case is also run through the real funnel (the POSIX sh/grep/awk script
the probe runs on a host) and ``probe.finish``: the funnel only brings back
the tail, keyword hits and tag context, so a decisive line it misses is a gap
in rules.yaml ``keywords``/``tags``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fleetdiag.analysis import _analyze, load_rules
from fleetdiag.analysis.lines import split_text
from fleetdiag.records import HEALTHY, STALLED, STARTING

# the verdicts the analyzer gives a log that did not fail (analysis.decide: the hung engine, the
# last waiting line after the last ready one, or neither)
NOT_FAILED = (HEALTHY, STARTING, STALLED)

CORPUS = Path(__file__).resolve().parent / "corpus_extra"
CASES = sorted(CORPUS.glob("*.json"))


def _label(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _healthy(path: Path) -> bool:
    """A label of a log that did not fail (``"verdict"`` in ``NOT_FAILED``): serving, starting or stalled."""
    return _label(path).get("verdict", "failed") != "failed"


def _known_wrong(label: dict, test: str) -> str | None:
    """The reason ``test`` is expected to fail on this case, if it is (see the module docstring)."""
    why = label.get("known_wrong")
    if isinstance(why, dict):
        return why.get(test)
    return why or None


def _params(test: str, healthy: bool = False):
    out = []
    for p in CASES:
        if _healthy(p) != healthy:
            continue
        why = _known_wrong(_label(p), test)
        marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
        out.append(pytest.param(p, id=p.stem, marks=marks))
    return out


@pytest.fixture(scope="module")
def rules():
    return load_rules(user_default=False)


def _case(path: Path):
    label = _label(path)
    text = path.with_suffix(".log").read_text(encoding="utf-8", errors="replace")
    return label, text


def _accepted(label: dict) -> list[str]:
    return [label["decisive"], *label.get("decisive_alt", [])]


def _check_line(label: dict, line: str) -> None:
    accepted = _accepted(label)
    assert any(a in line for a in accepted), f"decisive line {line!r}; expected one of {accepted!r}"
    for decoy in label.get("decoys", []):
        assert decoy not in line, f"picked a decoy: {decoy!r}"


def test_corpus_extra_is_present():
    assert len(CASES) >= 15, "the extra corpus fixtures are missing from tests/corpus_extra"
    # known failures are bookkeeping for cases the analyzer does not get yet, not a way to hide
    # the corpus: most of it must pass
    assert sum(1 for p in CASES if _label(p).get("known_wrong")) <= len(CASES) // 2


def test_labels_are_well_formed():
    """Every label is consistent with its log: texts present, decoys not on a decisive line."""
    keys = {"id", "source", "framework", "decisive", "decisive_process", "exception_type", "category", "decoys", "why"}
    dev_sources = {_label(p)["source"] for p in (CORPUS.parent / "corpus").glob("*.json")}
    for p in CASES:
        label, text = _case(p)
        assert keys <= set(label), p.stem
        assert label["id"] == p.stem
        assert label["source"] not in dev_sources, f"{p.stem} duplicates a dev corpus source"
        if _healthy(p):
            assert label["verdict"] in NOT_FAILED and label["decisive"] is None, p.stem
            assert label["category"] is None and label["exception_type"] is None, p.stem
            # the error or warning lines that must not fail it (a clean log has none)
            for d in label["decoys"]:
                assert d in text, (p.stem, d)
            continue
        assert label["category"] in ("config", "oom", "cuda", "nccl", "import", "python", "network", "disk", "other")
        for a in _accepted(label):
            assert a in text, (p.stem, a)
        for d in label["decoys"]:
            assert d in text, (p.stem, d)
            for line in text.split("\n"):
                if any(a in line for a in _accepted(label)):
                    assert d not in line, (p.stem, d)


@pytest.mark.parametrize("path", _params("test_decisive_line"))
def test_decisive_line(path: Path, rules):
    label, text = _case(path)
    diag = _analyze(split_text(text), rules)
    assert diag.verdict == "failed"
    assert diag.decisive is not None
    _check_line(label, diag.decisive.line)


@pytest.mark.parametrize("path", _params("test_type_category_process"))
def test_type_category_process(path: Path, rules):
    label, text = _case(path)
    dec = _analyze(split_text(text), rules).decisive
    assert dec is not None
    _check_line(label, dec.line)
    if "exception_type" in label:
        assert dec.exception_type == label["exception_type"]
    assert dec.category == label["category"]
    if "decisive_process" in label:
        assert dec.process == label["decisive_process"]


@pytest.mark.parametrize("path", _params("test_traceback_and_fields"))
def test_traceback_and_fields(path: Path, rules):
    label, text = _case(path)
    dec = _analyze(split_text(text), rules).decisive
    assert dec is not None
    _check_line(label, dec.line)
    assert dec.line in dec.traceback
    lines = text.split("\n")
    assert dec.lineno is not None
    # the file's line it starts on (a part of it, when the line relays a message unfolded into lines of its own)
    filed = lines[dec.lineno - 1]
    assert filed.strip()[:40] in dec.line or dec.line.strip()[:40] in filed
    # a line a terminal cut at its width is reported whole: it ends on a following physical line
    following = "".join(ln.rstrip() for ln in lines[dec.lineno - 1 : dec.lineno + 9])
    assert dec.line.strip()[-40:] in following
    assert len(dec.fingerprint) == 12
    assert 0.0 < dec.confidence <= 1.0
    assert dec.reason
    assert dec.hint


needs_sh = pytest.mark.skipif(
    not (shutil.which("sh") and shutil.which("grep") and shutil.which("awk")),
    reason="the funnel needs sh, grep and awk",
)


def _through_funnel(path: Path, rules, tail_lines: int | None = None):
    from fleetdiag.probe import finish, spec_for
    from fleetdiag.remote.funnel import run_local

    spec = spec_for(str(path.with_suffix(".log")), rules)
    if tail_lines is not None:
        spec.tail_lines = tail_lines
        spec.tail_bytes = 1
    fr = run_local(spec, timeout=60)
    # a pasted log has no "now": judge it as read right after it was written, so the
    # checkout's age on disk never turns a case into a stall
    if fr.mtime is not None:
        fr.now = fr.mtime
    return fr, finish("local", fr, rules)


@needs_sh
@pytest.mark.parametrize("path", _params("test_through_the_funnel"))
def test_through_the_funnel(path: Path, rules):
    """The real funnel + probe.finish reach the same decisive line."""
    label, _ = _case(path)
    fr, res = _through_funnel(path, rules)
    assert fr.status == "ok"
    assert res.decisive is not None
    _check_line(label, res.decisive.line)


@needs_sh
@pytest.mark.parametrize("path", _params("test_funnel_keywords_reach_the_decisive_line"))
def test_funnel_keywords_reach_the_decisive_line(path: Path, rules):
    """With almost no tail, keyword hits and tag context alone still bring the decisive line back."""
    label, text = _case(path)
    fr, _ = _through_funnel(path, rules, tail_lines=1)
    assert fr.status == "ok"
    texts = [ln.text for ln in fr.hits + fr.context]
    assert any(any(a in t for a in _accepted(label)) for t in texts), (
        "the funnel's keywords/tags miss the decisive line"
    )


@pytest.mark.parametrize("path", _params("test_not_failed_gets_its_verdict", healthy=True))
def test_not_failed_gets_its_verdict(path: Path, rules):
    """A log that did not fail gets its labelled verdict and no decisive line: a server that logged an error
    for one request and went on answering is healthy, one whose engine holds requests without progress
    behind a live front end is stalled, one that ends while it loads or warms up is starting."""
    label, text = _case(path)
    diag = _analyze(split_text(text), rules)
    assert diag.verdict == label["verdict"], (diag.verdict, diag.decisive and diag.decisive.line)
    assert diag.decisive is None
    if label.get("summary_has"):
        assert label["summary_has"] in diag.summary, diag.summary


@needs_sh
@pytest.mark.parametrize("path", _params("test_not_failed_verdict_through_the_funnel", healthy=True))
def test_not_failed_verdict_through_the_funnel(path: Path, rules):
    label, _ = _case(path)
    fr, res = _through_funnel(path, rules)
    assert fr.status == "ok"
    assert res.verdict == label["verdict"], res.decisive and res.decisive.line
