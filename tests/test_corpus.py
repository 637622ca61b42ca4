"""The analyzer on real failure logs from public bug reports (tests/corpus/README.md).

Each case is judged the way its label says: the reported line must contain
the labelled decisive text (or an accepted alternative) and none of the
decoys; type, category and process must match where labelled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetdiag.analysis import _analyze, load_rules
from fleetdiag.analysis.lines import split_text

CORPUS = Path(__file__).resolve().parent / "corpus"
CASES = sorted(CORPUS.glob("*.json"))


@pytest.fixture(scope="module")
def rules():
    return load_rules(user_default=False)


def _case(path: Path):
    label = json.loads(path.read_text(encoding="utf-8"))
    text = path.with_suffix(".log").read_text(encoding="utf-8", errors="replace")
    return label, text


def test_corpus_is_present():
    assert len(CASES) >= 20, "the corpus fixtures are missing from tests/corpus"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_decisive_line(path: Path, rules):
    label, text = _case(path)
    diag = _analyze(split_text(text), rules)
    assert diag.verdict == "failed"
    dec = diag.decisive
    assert dec is not None
    accepted = [label["decisive"], *label.get("decisive_alt", [])]
    assert any(a in dec.line for a in accepted), f"decisive line {dec.line!r}; expected one of {accepted!r}"
    for decoy in label.get("decoys", []):
        assert decoy not in dec.line, f"picked a decoy: {decoy!r}"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_type_category_process(path: Path, rules):
    label, text = _case(path)
    dec = _analyze(split_text(text), rules).decisive
    assert dec is not None
    assert dec.exception_type == label.get("exception_type")
    assert dec.category == label["category"]
    assert dec.process == label.get("decisive_process")


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_traceback_and_fields(path: Path, rules):
    """The decisive error carries its whole traceback, a reason, a fingerprint and a confidence."""
    label, text = _case(path)
    dec = _analyze(split_text(text), rules).decisive
    assert dec is not None
    assert dec.line in dec.traceback
    lines = text.split("\n")
    assert dec.lineno is not None and lines[dec.lineno - 1].rstrip("\r").endswith(dec.line.strip()[-40:])
    assert len(dec.fingerprint) == 12
    assert 0.0 < dec.confidence <= 1.0
    assert dec.reason
    assert dec.hint


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_public_entry_point_agrees(path: Path):
    """analyze_text (with the default rules and its safety net) gives the same answer."""
    from fleetdiag.analysis import analyze_text

    label, text = _case(path)
    dec = analyze_text(text).decisive
    assert dec is not None
    assert any(a in dec.line for a in [label["decisive"], *label.get("decisive_alt", [])])
