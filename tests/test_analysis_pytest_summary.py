"""pytest's short test summary ("FAILED <test id> - <exception>: <message>"): a failed test is an error of its own,
the exception after " - " its message, when the test's traceback is not in the window."""

from __future__ import annotations

from fleetdiag.analysis import analyze_text, load_rules
from fleetdiag.analysis.lines import parse_line
from fleetdiag.records import Line


def test_the_summary_lines_header_is_peeled_to_the_exception() -> None:
    ln = parse_line(0, Line(0, "FAILED [0.0107s] test/test_torch.py::T::test_x - torch.OutOfMemoryError: HIP out", 1))
    assert ln.level == "ERROR" and ln.source == "test/test_torch.py::T::test_x"
    assert ln.msg == "torch.OutOfMemoryError: HIP out"
    ln = parse_line(0, Line(0, "ERROR tests/a.py::test_setup - AssertionError: no GPU", 1))
    assert ln.level == "ERROR" and ln.msg == "AssertionError: no GPU"
    prose = "FAILED to connect - retrying"
    assert parse_line(0, Line(0, prose, 1)).msg == prose


def test_a_summary_alone_is_failed_with_its_exception_as_the_line() -> None:
    log = (
        "=========================== short test summary info ============================\n"
        "FAILED test_ff.py::test_moe[get_expert-4-top_2] - RuntimeError: Distributed package doesn't have NCCL built in\n"
        "========================= 1 failed, 20 passed in 12.01s =========================\n"
    )
    d = analyze_text(log, rules=load_rules(user_default=False))
    assert d.verdict == "failed"
    assert d.decisive is not None and d.decisive.line.endswith("doesn't have NCCL built in")
    assert d.decisive.exception_type == "RuntimeError"


def test_the_tests_own_traceback_above_its_summary_stays_the_answer() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "/w/tests/test_k.py", line 12, in test_x\n'
        "    torch.zeros(1).cuda()\n"
        "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
        "=========================== short test summary info ============================\n"
        "FAILED tests/test_k.py::test_x - RuntimeError: CUDA error: no kernel image is available for execution on the"
        " device\n"
    )
    d = analyze_text(log, rules=load_rules(user_default=False))
    assert d.decisive is not None and d.decisive.lineno == 4, (d.decisive.lineno, d.decisive.line)
