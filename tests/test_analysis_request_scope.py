"""Dress a native server puts on its lines, and errors scoped to one request (#22).

A server that names its own pid before every line ("[46009] ") or prints
llama.cpp's uptime stamp with or without a level letter still has its native
error as the decisive line; a server that answers one request with an error and
goes on serving is healthy, while the same request error followed by a crash is
judged on the crash.
"""

from __future__ import annotations

from fleetdiag.analysis import analyze_text, load_rules
from fleetdiag.analysis.lines import parse_line, split_text
from fleetdiag.analysis.normalise import normalise
from fleetdiag.records import Line

RULES = load_rules(user_default=False)
CUDA = "CUDA error: an illegal memory access was encountered"


def test_a_constant_pid_label_goes_a_varying_number_stays() -> None:
    text = f"[46009] 0.00.100.000 I srv  load_model: loading\n[46009] 0.54.236.075 E {CUDA}\n[46009] done\n"
    norm = normalise(split_text(text))
    assert norm.steps == ["line label removed"]
    assert [ln.text for ln in norm.lines][1] == f"0.54.236.075 E {CUDA}"
    ranks = "[0] step 1\n[1] step 1\n[0] step 2\n[1] step 2\n"
    assert normalise(split_text(ranks)).steps == []
    one_digit = "[3] a\n[3] b\n[3] c\n"  # a rank's tag, not a pid
    assert normalise(split_text(one_digit)).steps == []


def test_the_uptime_stamp_is_peeled_with_or_without_a_level_and_after_a_pid() -> None:
    with_level = parse_line(0, Line(0, f"53.26.801.941 E {CUDA}", 1))
    assert (with_level.msg, with_level.level, with_level.time) == (CUDA, "ERROR", "53.26.801.941")
    bare = parse_line(0, Line(0, "49.13.366.995 /src/ggml-cuda/fattn.cu:574: fatal error", 1))
    assert bare.msg == "/src/ggml-cuda/fattn.cu:574: fatal error" and bare.level is None
    pid = parse_line(0, Line(0, f"[56285] 0.54.236.075 E {CUDA}", 1))
    assert (pid.msg, pid.tags, pid.level) == (CUDA, ("56285",), "ERROR")
    debug = parse_line(0, Line(0, "0.00.001.000 D ggml_backend_load: loaded", 1))
    assert debug.level == "DEBUG"


def test_a_native_error_behind_the_dress_is_decisive() -> None:
    for log in (
        f"[46009] 0.10.929.932 I srv  llama_server: model loaded\n[46009] 0.54.236.075 E {CUDA}\n"
        "[46009] 0.54.236.080 E   current device: 0, in function ggml_backend_cuda_synchronize\n",
        "[46009] /b/ggml/src/ggml-cuda/fattn.cu:579: fatal error\n"
        "[46009] /b/bin/libggml-base.so.0(ggml_print_backtrace+0x1df) [0x7fbfdb553a3f]\n",
    ):
        d = analyze_text(log, rules=RULES)
        assert d.verdict == "failed" and d.decisive is not None
        assert ("illegal memory access" in d.decisive.line) or d.decisive.line.endswith("fatal error")


SERVED = (
    "0.35.370.518 I slot launch_slot_: id  0 | task 7 | processing task, is_child = 0\n"
    "0.35.370.600 E llama_decode: failed to decode, ret = -1\n"
    "0.35.370.610 E srv                send_error: task 7 | error = decoding exceeds the available context size\n"
)


def test_one_requests_error_then_more_requests_is_healthy() -> None:
    log = SERVED + (
        "0.36.000.001 I slot launch_slot_: id  0 | task 8 | processing task, is_child = 0\n"
        "0.38.536.234 I slot print_timing: id  0 | task 8 | n_decoded =    358, tg = 119.31 t/s\n"
    )
    d = analyze_text(log, rules=RULES)
    assert d.verdict == "healthy" and d.decisive is None
    assert "request errors:" in d.summary


def test_a_request_error_followed_by_a_crash_is_judged_on_the_crash() -> None:
    log = SERVED + (
        f"0.40.000.000 E {CUDA}\n"
        "0.40.000.001 E   current device: 0, in function ggml_backend_cuda_synchronize at ggml-cuda.cu:2780\n"
        "/b/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error\n"
    )
    d = analyze_text(log, rules=RULES)
    assert d.verdict == "failed" and d.decisive is not None
    assert "illegal memory access" in d.decisive.line
    assert "send_error" not in d.decisive.line


def test_a_test_tools_failure_after_its_fixed_width_rows_is_not_joined_to_a_row() -> None:
    """nccl-tests' result table has rows of one width (which look like lines a terminal cut at it); the
    host-tagged failure lines after them are lines of their own, so the failure stays decisive."""
    head = (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
        "   busbw #wrong\n"
    )
    row = (
        "  {:>10}     {:>9}     float     sum      -1   4532.1  236.92  473.38      0   4519.2  237.60  474.73      0\n"
    )
    rows = "".join(row.format(2**k, 2**k // 4) for k in range(27, 31))
    fails = "".join(
        f"node-{h}: Test NCCL failure common.cu:1204 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '\n"
        f" .. node-{h} pid {4000 + h}: Test failure common.cu:915\n"
        for h in (3, 7, 12)
    )
    for log in (head + rows + fails, "".join(f"[1,0]<stdout>:{ln}\n" for ln in (head + rows + fails).splitlines())):
        d = analyze_text(log, rules=RULES)
        assert d.decisive is not None, log
        assert d.decisive.line.endswith(
            "node-3: Test NCCL failure common.cu:1204 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '"
        ), d.decisive.line
        assert d.decisive.process == "node-3"
