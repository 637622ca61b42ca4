"""The shipped rules: portable ERE that grep/awk and Python read the same way.

The funnel runs ``keywords``, ``run_start``, ``tags``, ``waiting`` and
``ready`` with the remote host's grep -E / awk; the analyzer runs them with
Python. A pattern they disagree on would make the funnel bring back lines the
analyzer cannot see, or miss lines it needs, so the sets are compared here
with every tool available on this machine (GNU grep at least).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetdiag.analysis import load_rules
from fleetdiag.analysis.rules import ERE_SECTIONS, Pat, check_ere, needles, shipped_rules_path

CORPUS = Path(__file__).resolve().parent / "corpus"
CORPUS_EXTRA = Path(__file__).resolve().parent / "corpus_extra"

SAMPLES = [
    # block heads: a Rust panic, with the thread's id newer releases print and without it
    "thread 'main' (48213) panicked at src/engine/mod.rs:312:29:",
    "thread 'tokio-runtime-worker' panicked at router/src/infer/v3/queue.rs:180:58:",
    # keywords: a worker's one-line last words
    "/bin/sh: 1: vllm: not found",
    "/usr/bin/python3: No module named vllm.entrypoints.openai.api_serve",
    "\tGPU 1: FAULTY",
    # run_start
    "(APIServer pid=1) INFO 05-09 15:00:00 [api_server.py:1920] vLLM API server version 0.20.1",
    "INFO 10-24 13:47:42 [cli_args.py:264] non-default args: {'model': 'Qwen/Qwen3-8B-FP8'}",
    "(APIServer pid=1) INFO 05-09 15:00:00 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000",
    "INFO:torch.distributed.launcher.api:Starting elastic_operator with launch configs:",
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded",
    "[2020-12-24 16:25:13,185] [INFO] [runner.py:355:main] cmd = /usr/bin/python -u -m deepspeed.launcher.launch",
    "[2025-09-13 05:28:10] server_args=ServerArgs(model_path='/models/x', tp_size=8)",
    "2024-01-01 10:00:00,000\tINFO worker.py:1 -- Started a local Ray instance.",
    # waiting / ready
    "Waiting for vLLM server to be ready...",
    "health check failed, retrying in 5s",
    "(EngineCore_DP0 pid=2) Loading safetensors checkpoint shards:  50% Completed | 2/4",
    "INFO 05-09 15:00:40 [default_loader.py:268] Loading weights took 37.35 seconds",
    "INFO 05-09 15:00:40 [model_runner.py:2145] Starting to load model /models/x...",
    "Capturing CUDA graph shapes: 100%|##########| 67/67",
    "INFO 10-24 13:48:03 [core.py:581] Waiting for init message from front-end.",
    "INFO:     Application startup complete.",
    "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
    "[2025-09-13 05:29:00] The server is fired up and ready to roll!",
    '(APIServer pid=1) INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK',
    "INFO 05-09 15:01:10 [loggers.py:1] Engine 000: Avg prompt throughput: 20.1 tokens/s",
    "Server is ready",
    # keywords
    "Killed",
    "Segmentation fault (core dumped)",
    "*** SIGSEGV (@0x0) received by PID 1234",
    "Aborted (core dumped)",
    "[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] boom",
    "E0626 06:24:44.903881 12345 file.cc:1] boom",
    "F0626 06:24:44.903881 12345 file.cc:1] Check failed",
    "[ERROR] 2025-08-22-09:46:18 (PID:1) ERR99999 UNKNOWN",
    "EZ9999: Inner Error!",
    "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    "panic: runtime error",
    "  what():  CUDA error: an illegal memory access was encountered",
    "terminate called without an active exception",
    "failed (exitcode: -9) local_rank: 3 (pid: 1203)",
    "exits with return code = -9",
    "exited with exit code 1",
    "[Mon] Out of memory: Killed process 4242 (python)",
    "oom-kill:constraint=CONSTRAINT_NONE",
    "OOM when allocating",
    "OSError: [Errno 28] No space left on device",
    "Timed out waiting for workers",
    "NCCL watchdog thread terminated",
    "Assertion `idx < n` failed.",
    "FATAL: cannot start",
    "UNHANDLED EXCEPTION in worker",
    "CRITICAL something",
    "RuntimeError: See root cause above",
    "node7:311:311 [3] NCCL WARN Cuda failure 'out of memory'",
    # tags
    "(EngineCore_DP1 pid=6688) ERROR 05-09 15:15:10 [core.py:1005] EngineCore failed to start.",
    "(Worker pid=7506) ERROR 05-09 15:15:08 [multiproc_executor.py:870] Traceback (most recent call last):",
    "(VllmWorker rank=6 pid=653) ERROR 07-26 13:19:51 [multiproc_executor.py:539] WorkerProc hit an exception.",
    "(VllmWorker TP1 pid=21355) INFO 08-22 09:46:12 [multiproc_executor.py:520] Parent process exited",
    "(RayWorkerWrapper pid=553, ip=7.242.100.10) INFO 05-16 09:49:32 [parallel_state.py:1004] rank 15",
    "(pid=123) hello from a task",
    "(raylet, ip=10.0.0.1) worker died",
    "[rank3]: torch.OutOfMemoryError: CUDA out of memory.",
    "[default0]:[W socket.cpp:464] warn",
    "[1,0]<stderr>:Traceback (most recent call last):",
    "tj1-asr-train-v100-13:941227:943077 [0] NCCL INFO Call to connect returned Connection refused, retrying",
    "[2025-09-13 05:28:15 TP4] Scheduler hit an exception: Traceback (most recent call last):",
    "[2025-09-13 05:28:15 DP1 TP4] Scheduler hit an exception",
    "vllm-1  | (APIServer pid=1) INFO hi",
    "rdma-test-gpu-worker-1: Traceback (most recent call last):",
    "10.0.0.2: [2024-01-08 16:13:56,462] [INFO] x",
    "3: RuntimeError: boom",
    "error: unrecognized arguments: --tp",
    "RuntimeError: NCCL error: x",
    "[2026-05-28 00:11:09.816 DP0 TP0 EP0] Scheduler hit an exception",
    "srun: error: node-2: task 4: Exited with exit code 1",
    "(ServeReplica:default:LLMDeployment pid=14262) ERROR x",
    "[rank0]:[W socket.cpp:1] SIGBUS Bus error",
    # near misses that must not match everything
    "plain text",
    "",
    "   ",
    "INFO all good",
    "(not a tag) x",
    "[rankX]: x",
    "timestamp 10:28:33 [x.py:1] y",
]

# what the funnel's awk match() keeps as the process tag
EXPECTED_TAG = {
    "(EngineCore_DP1 pid=6688) ERROR": "(EngineCore_DP1 pid=6688)",
    "(VllmWorker rank=6 pid=653) ERROR": "(VllmWorker rank=6 pid=653)",
    "(RayWorkerWrapper pid=553, ip=7.242.100.10) INFO": "(RayWorkerWrapper pid=553, ip=7.242.100.10)",
    "(pid=123) hello": "(pid=123)",
    "(raylet, ip=10.0.0.1) worker": "(raylet, ip=10.0.0.1)",
    "2024-11-20 14:37:16 [rank3]: torch.OutOfMemoryError": "[rank3]:",
    "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] x": "[rank1]:",
    "[default0]:[W socket.cpp:464] warn": "[default0]:",
    "[1,0]<stderr>:Traceback": "[1,0]<stderr>:",
    "tj1-asr-train-v100-13:941227:943077 [0] NCCL INFO x": "tj1-asr-train-v100-13:941227:943077 [0]",
    "[2025-09-13 05:28:15 TP4] Scheduler": " TP4]",
    "[2025-09-13 05:28:15 DP1 TP4] Scheduler": " DP1 TP4]",
    "vllm-1  | (APIServer pid=1) INFO hi": "vllm-1  | ",
    "rdma-test-gpu-worker-1: torch.distributed.DistBackendError: x": "rdma-test-gpu-worker-1: ",
    "10.0.0.2: [2024-01-08 16:13:56,462] [INFO] x": "10.0.0.2: ",
    "error: unrecognized arguments: --tp": "-",
    "[2026-05-28 00:11:09.816 DP0 TP0 EP0] Scheduler hit an exception": " DP0 TP0 EP0]",
    "(ServeReplica:default:LLMDeployment pid=14262) ERROR x": "(ServeReplica:default:LLMDeployment pid=14262)",
    "RuntimeError: NCCL error: x": "-",
}


def _corpus_lines() -> list[str]:
    out: list[str] = []
    for log in sorted(CORPUS.glob("*.log")) + sorted(CORPUS_EXTRA.glob("*.log")):
        out.extend(log.read_text(encoding="utf-8", errors="replace").split("\n"))
    return out


LINES = [ln for ln in SAMPLES + _corpus_lines() if "\n" not in ln and "\r" not in ln]
RULES = load_rules(user_default=False)


def _tools() -> list[list[str]]:
    tools = []
    if shutil.which("grep"):
        tools.append(["grep"])
    for awk in ("mawk", "gawk", "original-awk", "awk"):
        if shutil.which(awk):
            tools.append([awk])
    if shutil.which("busybox"):
        tools.append(["busybox", "awk"])
    return tools


def _matching(tool: list[str], pattern: str, data: bytes) -> set[int]:
    env = {**os.environ, "LC_ALL": "C", "P": pattern}
    if tool == ["grep"]:
        proc = subprocess.run(["grep", "-a", "-n", "-E", "-e", pattern], input=data, capture_output=True, env=env)
        assert proc.returncode in (0, 1), proc.stderr
        assert not proc.stderr, proc.stderr  # GNU grep warns about stray backslashes and the like
        return {int(x.split(b":", 1)[0]) - 1 for x in proc.stdout.splitlines()}
    prog = 'BEGIN { p = ENVIRON["P"] } $0 ~ p { print NR - 1 }'
    proc = subprocess.run([*tool, prog], input=data, capture_output=True, env=env)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return {int(x) for x in proc.stdout.split()}


def test_grep_is_available():
    assert shutil.which("grep"), "the funnel needs grep; so does this test"


@pytest.mark.parametrize("section", ERE_SECTIONS)
def test_shipped_funnel_patterns_are_portable_ere(section):
    for pat in getattr(RULES, section):
        assert check_ere(pat) is None, (section, pat, check_ere(pat))


@pytest.mark.parametrize("section", ERE_SECTIONS)
def test_every_funnel_pattern_matches_some_sample(section):
    for pat in getattr(RULES, section):
        rx = re.compile(pat)
        assert any(rx.search(ln) for ln in LINES), f"{section}: {pat!r} matches no sample: add one"


@pytest.mark.parametrize("tool", _tools(), ids=lambda t: " ".join(t))
@pytest.mark.parametrize("section", ERE_SECTIONS)
def test_tools_and_python_agree(tool, section):
    data = "\n".join(LINES).encode("utf-8") + b"\n"
    union = {
        "keywords": RULES.keyword_ere,
        "run_start": RULES.run_start_ere,
        "tags": RULES.tag_ere,
        "waiting": RULES.waiting_ere,
        "ready": RULES.ready_ere,
        "block_heads": RULES.block_head_ere,
    }[section]()
    py = re.compile(union)
    expected = {i for i, ln in enumerate(LINES) if py.search(ln)}
    assert _matching(tool, union, data) == expected
    for pat in getattr(RULES, section):
        rx = re.compile(pat)
        assert _matching(tool, pat, data) == {i for i, ln in enumerate(LINES) if rx.search(ln)}, pat


def test_every_block_head_is_a_keyword_line():
    """The funnel's context pass sees only the lines its keyword grep kept: a block head no keyword matches
    would never start one."""
    heads = [ln for ln in LINES if re.search(RULES.block_head_ere(), ln)]
    assert any("panicked" in ln for ln in heads) and any("Traceback" in ln for ln in heads)
    kw = re.compile(RULES.keyword_ere())
    assert [ln for ln in heads if not kw.search(ln)] == []


@pytest.mark.parametrize("tool", [t for t in _tools() if t != ["grep"]], ids=lambda t: " ".join(t))
def test_awk_extracts_the_expected_tag(tool):
    data = "\n".join(EXPECTED_TAG).encode("utf-8") + b"\n"
    prog = 'BEGIN { t = ENVIRON["T"] } { if (match($0, t)) print substr($0, RSTART, RLENGTH); else print "-" }'
    env = {**os.environ, "LC_ALL": "C", "T": RULES.tag_ere()}
    proc = subprocess.run([*tool, prog], input=data, capture_output=True, env=env)
    got = proc.stdout.decode().split("\n")[: len(EXPECTED_TAG)]
    assert got == list(EXPECTED_TAG.values())


def test_keyword_ere_is_one_union():
    ere = RULES.keyword_ere()
    assert ere.count("|") >= len(RULES.keywords) - 1
    assert all(f"({p})" in ere for p in RULES.keywords)


@pytest.mark.parametrize(
    "pattern,bad",
    [
        (r"\d+", True),
        (r"\s", True),
        (r"\w", True),
        (r"\bfoo", True),
        ("(?i)x", True),
        ("(?:x)", True),
        ("a*?", True),
        ("a+?", True),
        ("a{2,3}", True),
        (r"[\d]", True),
        ("[[:digit:]]", True),
        ("[]x]", True),
        ("", True),
        ("(unclosed", True),
        ("x\\", True),
        ("Traceback \\(most recent call last\\)", False),
        ("[Ee]rror", False),
        ("a|b", False),
        (r"\[rank[0-9]+\]:", False),
        ("x.y*", False),
        ("^start", False),
        ("end$", False),
    ],
)
def test_check_ere(pattern, bad):
    assert (check_ere(pattern) is not None) == bad


def test_shipped_rules_file_is_where_the_package_says():
    assert shipped_rules_path().is_file()
    assert RULES.sources == [str(shipped_rules_path())]


@pytest.mark.parametrize(
    "pattern,text",
    [
        ("EngineDeadError|EngineCore encountered (a fatal error|an issue)", "EngineCore encountered an issue"),
        ("^(ImportError|ModuleNotFoundError)\\b|No module named", "ModuleNotFoundError: x"),
        ("[Ss]ee (the )?root cause above", "See the root cause above"),
        ("exitcode *: *-9\\b", "exitcode : -9"),
        ("(?i)killed", "KILLED"),
        ("Process (?i:killed) now", "Process KILLED now"),
        ("a.c", "abc"),
    ],
)
def test_literal_prefilter_never_hides_a_match(pattern, text):
    """The needles are an optimisation: any text the regex matches must pass them."""
    pat = Pat(pattern)
    assert re.search(pattern, text)
    assert pat.search(text) is not None
    nd = needles(pattern)
    assert nd is None or any(n in text for n in nd)


def test_needles_never_hide_a_shipped_match():
    for sig in RULES.signatures:
        for ln in LINES:
            if sig.regex.search(ln):
                assert sig.pat.search(ln) is not None, (sig.name, ln)
    for rule in RULES.secondary:
        for ln in LINES:
            if rule.regex.search(ln):
                assert rule.pat.search(ln) is not None, (rule.kind, ln)
