"""Property tests: no input makes the analyzer raise, and its answers stay well-formed.

The unguarded core (``_analyze``) is tested, not only the public entry point
whose safety net would hide a crash.
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetdiag.analysis import _analyze, analyze, analyze_text, load_rules
from fleetdiag.analysis.lines import split_text
from fleetdiag.records import Diagnosis, Line

RULES = load_rules(user_default=False)
VERDICTS = {"failed", "starting", "healthy"}
CATEGORIES = {"config", "oom", "cuda", "nccl", "import", "python", "network", "disk", "other"}
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Fragments real logs are made of, so random mixes reach deep into the parser and the traceback builder.
PREFIXES = [
    "",
    "(Worker pid=7506) ",
    "(EngineCore_DP1 pid=6688) ",
    "(APIServer pid=1) ",
    "[rank3]: ",
    "[default0]:",
    "(RayWorkerWrapper pid=5, ip=10.0.0.1) ",
    "node1:1:2 [0] ",
    "vllm-1  | ",
    "[2025-09-13 05:28:15 TP4] ",
    "2024-11-20 14:37:16 ",
    "\x1b[36m(Worker pid=1)\x1b[0m ",
    "(",
    "[",
    "[rank",
    "&nbsp;",
]
HEADERS = [
    "",
    "ERROR 05-09 15:15:08 [multiproc_executor.py:870] ",
    "INFO 05-09 15:15:08 [x.py:1] ",
    "WARNING 05-09 15:15:08 [x.py:1] ",
    "[E626 06:24:44.9 ProcessGroupNCCL.cpp:616] ",
    "[ERROR] ",
    "ERROR:root:",
    "INFO:     ",
    "[2020-12-24 16:25:13,160] [WARNING] [runner.py:117:fetch_hostfile] ",
]
BODIES = [
    "Traceback (most recent call last):",
    '  File "/a.py", line 3, in f',
    "    x = y()",
    "    ^^^^^^",
    "ValueError: boom",
    "AssertionError",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB",
    "",
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
    "terminate called after throwing an instance of 'c10::Error'",
    "  what():  CUDA error: x",
    "frame #0: c10::Error::Error() + 0x1",
    "NCCL WARN Connect to 10.0.0.1<1> failed : Connection refused",
    "Killed",
    "Segmentation fault (core dumped)",
    "failed (exitcode: -9) local_rank: 1 (pid: 9)",
    "Exception: Worker failed with error 'x', please check the stack trace above for the root cause",
    "Exception: Worker failed with error '",
    "EngineCore failed to start.",
    "BrokenPipeError: [Errno 32] Broken pipe",
    "Exception ignored in: <function X.__del__ at 0x7f>",
    "Process EngineCore_DP0:",
    "vLLM API server version 0.20.1",
    "Waiting for vLLM server to be ready...",
    "Application startup complete.",
    "rank 3 in world size 4",
    "[Previous line repeated 996 more times]",
    "Error: x",
    "\x00\x00",
    "\r",
    "\ufffd" * 3,
]

fragment_line = st.builds(
    lambda p, h, b, tail: p + h + b + tail,
    st.sampled_from(PREFIXES),
    st.sampled_from(HEADERS),
    st.sampled_from(BODIES),
    st.text(max_size=20),
)
log_text = st.lists(st.one_of(fragment_line, st.text(max_size=80)), max_size=80).map("\n".join)


def check(diag: Diagnosis, texts: list[str] | None = None) -> None:
    assert isinstance(diag, Diagnosis)
    assert diag.verdict in VERDICTS
    if diag.verdict == "failed":
        dec = diag.decisive
        assert dec is not None
        assert dec.category in CATEGORIES
        assert 0.0 <= dec.confidence <= 1.0
        assert isinstance(dec.fingerprint, str) and len(dec.fingerprint) == 12
        assert dec.line in dec.traceback
        assert all(isinstance(k, str) and v > 0 for k, v in diag.secondary.items())
        if texts is not None:
            assert (
                any(dec.line in t or dec.line.strip() in t for t in texts)
                or "\x1b" in "".join(texts)
                or "\r" in "".join(texts)
            )
    else:
        assert diag.decisive is None
        assert diag.summary


@SETTINGS
@given(st.text())
def test_any_text(text):
    check(_analyze(split_text(text), RULES))
    check(analyze_text(text, rules=RULES))


@SETTINGS
@given(st.binary(max_size=4000))
def test_any_bytes_decoded_with_replace(blob):
    text = blob.decode("utf-8", errors="replace")
    check(_analyze(split_text(text), RULES))
    check(analyze_text(blob, rules=RULES))


@SETTINGS
@given(log_text)
def test_log_shaped_text(text):
    check(_analyze(split_text(text), RULES), text.split("\n"))


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=-(2**40), max_value=2**40),
            st.one_of(fragment_line, st.text(max_size=60)),
            st.one_of(st.none(), st.integers(min_value=-5, max_value=10**6)),
        ),
        max_size=60,
    )
)
def test_sparse_unordered_duplicated_lines(items):
    lines = [Line(pos=p, text=t, lineno=n) for p, t, n in items]
    check(_analyze(lines, RULES))
    check(analyze(lines, rules=RULES))


@SETTINGS
@given(
    log_text,
    st.dictionaries(
        st.sampled_from(["cuda_visible_devices", "gpus", "parallel", "serving", "x"]),
        st.one_of(
            st.none(),
            st.integers(),
            st.text(max_size=10),
            st.lists(st.integers(), max_size=4),
            st.dictionaries(st.sampled_from(["tp", "dp", "pp"]), st.one_of(st.integers(), st.text(max_size=3))),
        ),
    ),
)
def test_any_facts(text, facts):
    check(_analyze(split_text(text), RULES, facts))


def test_not_even_wrong_types_raise():
    for bad in (None, [None], [1, 2], ["text line", b"bytes line"], [Line(pos=None, text=None)]):  # type: ignore[arg-type]
        check(analyze(bad, rules=RULES))  # type: ignore[arg-type]


def _regex_strategy(pattern: str):
    return st.from_regex(pattern, fullmatch=False)


PATTERNS = sorted(
    {s.pattern for s in RULES.signatures}
    | {r.pattern for r in RULES.secondary}
    | {p for sec in ("keywords", "run_start", "tags", "waiting", "ready", "benign") for p in getattr(RULES, sec)}
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_literal_prefilter_never_hides_a_match(data):
    """Every string a rule's regex matches passes its literal pre-check too."""
    from fleetdiag.analysis.rules import Pat

    for pattern in PATTERNS:
        text = data.draw(_regex_strategy(pattern), label=pattern)
        if re.search(pattern, text):
            assert Pat(pattern).search(text) is not None, (pattern, text)
