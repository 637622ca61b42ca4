"""Labels of the held-back corpus and the extra kernel cases agree with their logs.

Only consistency is checked here (every quoted line is in its file, no decoy sits on a
decisive line, no source repeats another corpus's), never what the analyzer answers:
tests/corpus_heldout, tests/corpus_heldout2, tests/corpus_heldout3, tests/corpus_heldout4,
tests/corpus_heldout5, tests/corpus_heldout6, tests/corpus_heldout7, tests/corpus_heldout8, tests/corpus_heldout9, tests/corpus_heldout10, tests/corpus_heldout11, tests/corpus_heldout12, tests/corpus_heldout13, tests/corpus_heldout14 and tests/corpus_heldout15 are kept out of rule development, and the kernel cases are judged through the kernel tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
HELDOUT = TESTS / "corpus_heldout"
HELDOUT2 = TESTS / "corpus_heldout2"
HELDOUT3 = TESTS / "corpus_heldout3"
HELDOUT4 = TESTS / "corpus_heldout4"
HELDOUT5 = TESTS / "corpus_heldout5"
HELDOUT6 = TESTS / "corpus_heldout6"
HELDOUT7 = TESTS / "corpus_heldout7"
HELDOUT8 = TESTS / "corpus_heldout8"
HELDOUT9 = TESTS / "corpus_heldout9"
HELDOUT10 = TESTS / "corpus_heldout10"
HELDOUT11 = TESTS / "corpus_heldout11"
HELDOUT12 = TESTS / "corpus_heldout12"
HELDOUT13 = TESTS / "corpus_heldout13"
HELDOUT14 = TESTS / "corpus_heldout14"
HELDOUT15 = TESTS / "corpus_heldout15"
KERNEL_SETS = [
    TESTS / "corpus_kernel_extra",
    HELDOUT / "kernel",
    HELDOUT4 / "kernel",
    HELDOUT5 / "kernel",
    HELDOUT6 / "kernel",
    HELDOUT7 / "kernel",
]
APP_KEYS = {"id", "source", "framework", "decisive", "decisive_process", "exception_type", "category", "decoys", "why"}
KERNEL_KEYS = {"id", "source", "kind", "xid", "decisive_kernel_line", "decoys", "meaning", "files"}
CATEGORIES = {"config", "oom", "cuda", "nccl", "import", "python", "network", "disk", "other"}
# the verdicts the analyzer gives a log that did not fail (tests/corpus_extra/README.md)
NOT_FAILED = {"healthy", "starting", "stalled"}


def _labels(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json"))


def _sources(*folders: Path) -> list[str]:
    return [json.loads(p.read_text(encoding="utf-8"))["source"] for f in folders for p in _labels(f)]


@pytest.mark.parametrize(
    "path",
    [
        *_labels(HELDOUT),
        *_labels(HELDOUT2),
        *_labels(HELDOUT3),
        *_labels(HELDOUT4),
        *_labels(HELDOUT5),
        *_labels(HELDOUT6),
        *_labels(HELDOUT7),
        *_labels(HELDOUT8),
        *_labels(HELDOUT9),
        *_labels(HELDOUT10),
        *_labels(HELDOUT11),
        *_labels(HELDOUT12),
        *_labels(HELDOUT13),
        *_labels(HELDOUT14),
        *_labels(HELDOUT15),
    ],
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
def test_heldout_label_matches_its_log(path: Path) -> None:
    label = json.loads(path.read_text(encoding="utf-8"))
    text = path.with_suffix(".log").read_text(encoding="utf-8", errors="replace")
    assert APP_KEYS <= set(label) and label["id"] == path.stem
    assert len(text.encode()) <= 200_000
    if label.get("verdict", "failed") != "failed":
        assert label["verdict"] in NOT_FAILED, label["verdict"]
        assert label["decisive"] is None
        assert all(d in text for d in label["decoys"])
        return
    assert label["category"] in CATEGORIES
    accepted = [label["decisive"], *label.get("decisive_alt", [])]
    assert all(a in text for a in accepted), accepted
    for decoy in label["decoys"]:
        assert decoy in text, decoy
        assert not any(decoy in ln for ln in text.split("\n") if any(a in ln for a in accepted)), decoy


@pytest.mark.parametrize(
    "path", [p for f in KERNEL_SETS for p in _labels(f)], ids=lambda p: f"{p.parent.name}/{p.stem}"
)
def test_kernel_label_matches_its_files(path: Path) -> None:
    label = json.loads(path.read_text(encoding="utf-8"))
    assert KERNEL_KEYS <= set(label) and label["id"] == path.stem
    files = {k: (path.parent / v).read_text(encoding="utf-8") for k, v in label["files"].items() if v}
    kern = files["kern"]
    assert label["decisive_kernel_line"] in kern
    for line in [*label.get("secondary_kernel_lines", []), *label["decoys"]]:
        assert line in kern or line in files.get("app", ""), line
    decisive_lines = [ln for ln in kern.split("\n") if label["decisive_kernel_line"] in ln]
    assert not any(d in ln for d in label["decoys"] for ln in decisive_lines)
    if label.get("decisive_app_line"):
        assert label["decisive_app_line"] in files["app"]


def test_no_source_is_used_twice() -> None:
    """A held-back case from a source the tuned corpora already use would not be held back."""
    tuned = set(_sources(TESTS / "corpus", TESTS / "corpus_extra", TESTS / "corpus_kernel_extra"))
    held = _sources(HELDOUT, HELDOUT / "kernel")
    assert len(held) == len(set(held))
    assert not tuned & set(held)


def _sources_besides(held: Path) -> set[str]:
    """Every source of every other corpus: the tests' sets (kernel folders included), the multi-node
    recordings, and the shared corpus where this machine has it."""
    folders = [d for d in TESTS.glob("corpus*") if d.is_dir() and d != held and d.name != "corpus_multinode"]
    folders += [d / "kernel" for d in folders if (d / "kernel").is_dir()]
    other = set(_sources(*folders))
    other |= {
        json.loads(p.read_text(encoding="utf-8")).get("source", "") for p in (TESTS / "corpus_multinode").glob("*.json")
    }
    shared = Path(os.environ.get("FLEETDIAG_SHARED", "/work/shared")) / "corpus"
    if shared.is_dir():
        other |= {json.loads(p.read_text(encoding="utf-8")).get("source", "") for p in shared.glob("*/*.json")}
    return other


@pytest.mark.parametrize(
    "held, least",
    [
        (HELDOUT2, 25),
        (HELDOUT3, 24),
        (HELDOUT4, 30),
        (HELDOUT5, 35),
        (HELDOUT6, 31),
        (HELDOUT7, 20),
        (HELDOUT8, 22),
        (HELDOUT9, 24),
        (HELDOUT10, 24),
        (HELDOUT11, 24),
        (HELDOUT12, 20),
        (HELDOUT13, 20),
        (HELDOUT14, 24),
        (HELDOUT15, 22),
    ],
    ids=[
        "heldout2",
        "heldout3",
        "heldout4",
        "heldout5",
        "heldout6",
        "heldout7",
        "heldout8",
        "heldout9",
        "heldout10",
        "heldout11",
        "heldout12",
        "heldout13",
        "heldout14",
        "heldout15",
    ],
)
def test_a_later_heldout_set_shares_no_source(held: Path, least: int) -> None:
    """tests/corpus_heldout2 to 15 (with their kernel cases) are each held back from every other corpus,
    the other held-back sets included."""
    sources = _sources(held, *([held / "kernel"] if (held / "kernel").is_dir() else []))
    assert len(sources) >= least and len(sources) == len(set(sources))
    other = _sources_besides(held)
    assert not other & set(sources), other & set(sources)
