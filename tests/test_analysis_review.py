"""Defects found reviewing the analyzer, each pinned: hostile lines cost linear time, a weak detail line does not
hide a strong one, and the helpers keep their contracts."""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetdiag.analysis import analyze_text, load_rules
from fleetdiag.analysis.lines import parse_line, unframe
from fleetdiag.records import Line

RULES = load_rules(user_default=False)
# the frame a terminal UI draws around each line, as the line model once matched it (cubic on a long blank run)
_OLD_FRAME = re.compile(r"^[│┃║]\s?(.*?)\s*[│┃║]?\s*$")


def _seconds(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def test_a_framed_line_of_blanks_is_parsed_in_linear_time() -> None:
    """A line a terminal UI framed, then a long run of blanks and no closing frame: 1,500 of them took seconds
    (the funnel sends lines of up to 4,096 characters: minutes)."""
    for ch in "│┃║":
        assert _seconds(parse_line, 0, Line(0, ch + " " * 1500 + "x", 1)) < 0.2
        assert _seconds(parse_line, 0, Line(0, ch + " \t" * 2000 + "x  " + " " * 2000, 1)) < 0.2
    framed = "│ ERROR 09-27 06:46:46 engine.py:157] RuntimeError: CUDA error: an illegal memory access" + " " * 3000
    assert parse_line(0, Line(0, framed + "│", 1)).msg == "RuntimeError: CUDA error: an illegal memory access"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="│┃║ \t\u3000ab|", min_size=1, max_size=14))
def test_the_frame_comes_off_as_it_did(text: str) -> None:
    """The frame's removal is the old pattern's, character for character, on every short mix of frames, blanks
    and text."""
    s = "│" + text
    assert unframe(s) == _OLD_FRAME.sub(r"\1", s)
