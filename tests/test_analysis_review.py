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

from .review_texts import WRAPPED

RULES = load_rules(user_default=False)
# the frame a terminal UI draws around each line, as the line model once matched it (cubic on a long blank run)
_OLD_FRAME = re.compile(r"^[│┃║]\s?(.*?)\s*[│┃║]?\s*$")


def _seconds(fn, *args) -> float:
    """CPU seconds of one call (a shared machine's load does not count)."""
    t = time.process_time()
    fn(*args)
    return time.process_time() - t


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


_STATS = (
    "INFO 10-22 12:00:{:02d} [loggers.py:116] Engine 000: Avg prompt throughput: {} tokens/s, Avg generation "
    "throughput: 0.0 tokens/s, Running: {} reqs, Waiting: 3 reqs, GPU KV cache usage: 2.1%"
)


def test_engine_reports_are_read_in_linear_time_and_never_raise() -> None:
    """An engine's report line: a run of "Running:" with no "Waiting:" after it cost quadratic time (two lazy gaps
    in one pattern), and a stray "." as a number raised, so the whole log lost its diagnosis."""
    from fleetdiag.analysis.decide import engine_report

    hostile = "Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 1.0 tokens/s," + "Running: 1 reqs," * 250
    assert engine_report(hostile) is None
    assert _seconds(engine_report, hostile * 4) < 0.01
    rep = engine_report(_STATS.format(0, "0.0", 2))
    assert rep is not None and (rep.prompt, rep.generation, rep.running, rep.waiting) == ("0.0", "0.0", 2, 3)
    v0 = "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Swapped: 0 reqs, Pending: 4 reqs"
    assert engine_report(v0) is not None and engine_report(v0).waiting == 4
    for bad in (".", "1.2.3", "..."):
        assert engine_report(_STATS.format(0, bad, 1)) is None

    # the analysis of a whole log: its error stands, its hung engine is still seen
    error = "ERROR 10-22 12:01:00 [core.py:12] RuntimeError: CUDA error: an illegal memory access was encountered"
    garbled = "\n".join(_STATS.format(k, ".", 1) for k in range(3))
    d = analyze_text(garbled + "\n" + error + "\n", rules=RULES)
    assert d.verdict == "failed" and d.decisive is not None and "illegal memory access" in d.decisive.line
    hung = analyze_text("\n".join(_STATS.format(k, "0.0", 2) for k in range(3)) + "\n", rules=RULES)
    assert hung.verdict == "stalled" and "engine hung: 3 reports in a row" in hung.summary
    assert "(running 2, waiting 3) and no progress (prompt 0.0, generation 0.0 tokens/s)" in hung.summary


def test_an_exit_code_in_a_message_does_not_hide_the_cause_after_it() -> None:
    """An exception's message carrying a child's output: its exit code (a weak signature, early in rules order)
    is dropped, and the strong signature of a later line of the message still names the error."""
    d = analyze_text(WRAPPED, rules=RULES)
    assert d.decisive is not None and d.decisive.line == "RuntimeError: shard writer failed:"
    assert (d.decisive.rule, d.decisive.category, d.decisive.role) == ("host-alloc-failed", "oom", "cause")
    # the code alone: the exception keeps no signature, and is not the launcher's line
    alone = analyze_text(WRAPPED.replace("mmap of the shared buffer: Cannot allocate memory\n", ""), rules=RULES)
    assert alone.decisive is not None and (alone.decisive.rule, alone.decisive.role) == (None, "cause")


XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def test_kernel_stamps_in_a_localised_month_keep_their_time() -> None:
    """`dmesg -T` and `journalctl -o short` print the month in the user's locale (a ticket's attachment from a
    Polish, German or Russian desktop): the line keeps its time, the same as the C locale's."""
    from fleetdiag.evidence.kernel import Clock, parse_kernel_lines

    clock = Clock(now=1.75e9, year=2025)
    c_locale = [f"[Fri Apr 11 10:00:00 2025] {XID}", f"Apr 11 10:00:00 gpu7 kernel: {XID}"]
    localised = [
        f"[pią kwi 11 10:00:00 2025] {XID}",  # pl_PL
        f"[Fr Apr 11 10:00:00 2025] {XID}",  # de_DE: a two-letter weekday
        f"[ven. avril 11 10:00:00 2025] {XID}",  # fr_FR
        f"[Пт апр 11 10:00:00 2025] {XID}",  # ru_RU
        f"kwi 11 10:00:00 gpu7 kernel: {XID}",  # journalctl -o short under pl_PL
        f"avril 11 10:00:00 gpu7 kernel: {XID}",
    ]
    want = {ev.time for ev in parse_kernel_lines(c_locale, clock)}
    assert len(want) == 1 and None not in want
    got = parse_kernel_lines(localised, clock)
    assert [ev.time for ev in got] == [want.pop()] * len(localised)
    assert all(ev.kind == "xid" and ev.code == 79 and ev.message == XID for ev in got)


def test_xid_109_is_classed_as_nvidias_catalog_resolves_it() -> None:
    """NVIDIA's Xid catalog resolves 109 (ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR) with RESET_GPU, then CONTACT_SUPPORT:
    the GPU needs a reset (driver class, which stands alone), not only the job a restart (application)."""
    from fleetdiag.evidence.xid import load_xid_table

    info = load_xid_table().get(109)
    assert (info.name, info.action) == ("Context Switch Timeout", "driver")
    assert "reset the GPU" in info.meaning


def test_the_latest_run_of_many_stages_is_found_in_linear_time() -> None:
    """A log of several services (docker-compose): each earlier line of another stage asked whether that stage
    started again by reading every later line (4,000 lines took 12 s). The answer is unchanged: an earlier stage's
    error stays, a stage that restarted loses its older lines."""
    from fleetdiag.analysis.decide import current_lines
    from fleetdiag.analysis.lines import parse_all, split_text

    n = 4000
    lines = [f"worker-{k % 7}  | INFO step {k} loss 0.1" for k in range(n)]
    lines += ["api  | INFO Starting vLLM API server on http://0.0.0.0:8000"]
    lines += [f"worker-{k % 7}  | INFO step {k} loss 0.1" for k in range(n)]
    parsed = parse_all(split_text("\n".join(lines) + "\n"))
    assert _seconds(current_lines, parsed, RULES) < 0.5
    assert len(current_lines(parsed, RULES)) == len(parsed)  # no stage restarted: every worker line stays

    log = [
        "db  | ERROR disk failed: No space left on device",
        "api  | INFO old run",
        "web  | INFO Starting vLLM API server on http://0.0.0.0:8001",
        "api  | INFO Starting vLLM API server on http://0.0.0.0:8000",
        "web  | INFO serving",
    ]

    def kept(lines: list[str]) -> list[str]:
        return [ln.raw for ln in current_lines(parse_all(split_text("\n".join(lines) + "\n")), RULES)]

    assert kept(log) == [log[0], log[2], log[3], log[4]]  # the banner's own stage loses its older run
    again = [*log, "db  | INFO Starting vLLM API server on http://0.0.0.0:8002"]
    assert kept(again) == [*log[1:], again[-1]]  # db started again, last: its old error is gone


def test_markdown_and_front_end_prefixes_are_read_in_linear_time() -> None:
    """Hostile 4 KiB lines (the funnel's cap) of a paste's dress or a front-end's prefix pieces: each is one
    anchored pass, never a scan per occurrence."""
    from fleetdiag.analysis.normalise import normalise, undress

    bad = [
        "`" * 4096,
        "> " * 2048,
        ">" * 4096,
        "~" * 4096,
        "[" + "." * 4095,
        "<summary>" + "<" * 4087,
        "- " + "a" * 4094,
        "``" + " `" * 2047,
        "a." * 2047 + " 1 ERROR",
        "[Info] " + "(" * 4089,
        "SUBPROCESS" * 409 + ": x",
        "a" + "`" * 4090 + "x`",
        "**" + "a*" * 2046 + "**",
    ]
    for text in bad:
        assert _seconds(undress, text) < 0.2, text[:20]
        assert _seconds(parse_line, 0, Line(0, "2026-05-08 11:42:09.093 " + text, 1)) < 0.2, text[:20]
    lines = [Line(k * 4200, t, k + 1) for k, t in enumerate(bad * 40)]
    assert _seconds(normalise, lines) < 1.0
