"""The failure shapes the analyzer used to get wrong, one group per shape.

Each case is the shape reduced to its few telling lines (the real logs of each
shape live in tests/corpus_extra); the tests vary the wording around the rule
so that a rule keyed to one log's text fails them.
"""

from __future__ import annotations

import pytest

from fleetdiag.analysis import _analyze, load_rules
from fleetdiag.analysis.lines import parse_line, split_text
from fleetdiag.records import Line


@pytest.fixture(scope="module")
def rules():
    return load_rules(user_default=False)


def run(text: str, rules):
    return _analyze(split_text(text), rules)


TORCHRUN_FAILED = (
    "E0208 21:12:26.795000 1460 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] "
    "failed (exitcode: {code}) local_rank: 0 (pid: 1464) of binary: /usr/bin/python3"
)
TORCHRUN_TB = [
    "Traceback (most recent call last):",
    '  File "/usr/bin/torchrun", line 8, in <module>',
    "    sys.exit(main())",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "train.py FAILED",
]


# ---------------------------------------------------------------- 1. one-line last words under a launcher
@pytest.mark.parametrize(
    "last_words, code, category",
    [
        ("python3: can't open file '/srv/job/train.py': [Errno 2] No such file or directory", 2, "config"),
        ("/opt/venv/bin/python: can't open file 'pretrain.py': [Errno 13] Permission denied", 2, "config"),
        ("/usr/bin/python3: No module named vllm.entrypoints.openai.api_serve", 1, "config"),
        (
            "/usr/bin/python: Error while finding module specification for 'trainer.main' (ModuleNotFoundError: No module named 'trainer')",
            1,
            "config",
        ),
        ("/bin/sh: 1: vllm: not found", 127, "config"),
        ("bash: line 3: deepspeed: command not found", 127, "config"),
        ("Illegal instruction (core dumped)", -4, "config"),
        ("CUDA driver version is insufficient for CUDA runtime version", 1, "config"),
        ("Killed", -9, "oom"),
    ],
)
def test_workers_last_words_beat_the_launchers_summary(rules, last_words, code, category):
    text = "\n".join(
        [
            "INFO:torch.distributed.run:Setting OMP_NUM_THREADS environment variable for each process",
            last_words,
            TORCHRUN_FAILED.format(code=code),
            *TORCHRUN_TB,
        ]
    )
    dec = run(text, rules).decisive
    assert dec is not None
    assert dec.line == last_words
    assert dec.category == category
    assert "exitcode" not in dec.line


def test_launcher_summary_still_decides_when_the_worker_said_nothing(rules):
    text = "\n".join([TORCHRUN_FAILED.format(code=1), *TORCHRUN_TB])
    assert "failed (exitcode: 1)" in run(text, rules).decisive.line


# ---------------------------------------------------------------- 2. a handled error earlier in the run
HANDLED = [
    "2025-01-03 10:00:01,000 - trainer - ERROR - Failed to upload checkpoint shard 3, retrying in 5s",
    "Traceback (most recent call last):",
    '  File "/srv/trainer/upload.py", line 40, in push',
    "    resp.raise_for_status()",
    "requests.exceptions.HTTPError: 503 Server Error: Service Unavailable for url: https://store/ckpt",
    "2025-01-03 10:00:06,000 - trainer - INFO - Uploaded checkpoint shard 3",
    "2025-01-03 10:00:07,000 - trainer - INFO - step 1200 loss 1.93",
    "2025-01-03 10:00:09,000 - trainer - INFO - step 1210 loss 1.91",
]


def test_a_survived_error_does_not_beat_the_crash(rules):
    text = "\n".join(
        [
            *HANDLED,
            "Traceback (most recent call last):",
            '  File "/srv/trainer/train.py", line 88, in step',
            "    loss.backward()",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        ]
    )
    diag = run(text, rules)
    assert diag.verdict == "failed"
    assert "CUDA out of memory" in diag.decisive.line
    assert diag.secondary.get("handled errors (the process went on normally)") == 1


def test_a_survived_error_alone_is_not_a_failure(rules):
    diag = run("\n".join(HANDLED), rules)
    assert diag.verdict == "healthy"
    assert "handled errors: 1" in diag.summary


def test_an_error_followed_by_shutdown_chatter_is_not_survived(rules):
    text = "\n".join(
        HANDLED[:5]
        + [
            "2025-01-03 10:00:06,000 - trainer - INFO - Shutting down workers",
            "2025-01-03 10:00:06,000 - trainer - INFO - Cleaning up",
            "2025-01-03 10:00:07,000 - trainer - INFO - exiting with code 1",
        ]
    )
    diag = run(text, rules)
    assert diag.verdict == "failed"
    assert "HTTPError" in diag.decisive.line


def test_other_processes_going_on_do_not_make_an_error_survived(rules):
    text = "\n".join(
        [
            "(Worker_TP1 pid=11) ERROR 05-09 15:15:08 [multiproc_executor.py:870] ValueError: bad shape",
            "(Worker_TP0 pid=10) INFO 05-09 15:15:09 [gpu_model_runner.py:1] Loading weights took 3.1 s",
            "(Worker_TP0 pid=10) INFO 05-09 15:15:09 [gpu_model_runner.py:1] Model loading took 14 GiB",
            "(Worker_TP0 pid=10) INFO 05-09 15:15:09 [gpu_model_runner.py:1] Compiling a graph",
            "(Worker_TP0 pid=10) INFO 05-09 15:15:10 [gpu_model_runner.py:1] Graph capturing finished",
        ]
    )
    diag = run(text, rules)
    assert diag.verdict == "failed"
    assert "ValueError: bad shape" in diag.decisive.line


# ---------------------------------------------------------------- 3. a server's per-request errors
def _server(after: list[str]) -> str:
    api = "(APIServer pid=7)"
    return "\n".join(
        [
            f"{api} INFO 06-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0",
            f"{api} INFO:     Application startup complete.",
            f"{api} ERROR 06-01 10:01:00 [serving_chat.py:220] Error in chat completion stream generator.",
            f"{api} ERROR 06-01 10:01:00 [serving_chat.py:220] Traceback (most recent call last):",
            f'{api} ERROR 06-01 10:01:00 [serving_chat.py:220]   File "/vllm/entrypoints/openai/serving_chat.py", line 200, in create',
            f"{api} ERROR 06-01 10:01:00 [serving_chat.py:220]     tools = parse(request.tools)",
            f"{api} ERROR 06-01 10:01:00 [serving_chat.py:220] KeyError: 'function'",
            *[f"{api} {x}" for x in after],
        ]
    )


@pytest.mark.parametrize(
    "after",
    [
        [
            'INFO:     10.0.0.9:5512 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request',
            'INFO:     10.0.0.9:5513 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        ],
        [
            "INFO 06-01 10:01:10 [loggers.py:1] Engine 000: Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: 40.0 tokens/s"
        ],
    ],
)
def test_a_server_that_keeps_serving_is_healthy(rules, after):
    diag = run(_server(after), rules)
    assert diag.verdict == "healthy"
    assert diag.decisive is None
    assert "request errors: 1" in diag.summary


@pytest.mark.parametrize(
    "after",
    [
        [],  # nothing after it
        [
            'INFO:     10.0.0.9:5513 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error',
            'INFO:     10.0.0.9:5514 - "GET /metrics HTTP/1.1" 200 OK',
        ],  # 5xx and probes: not serving
    ],
)
def test_an_error_the_server_did_not_recover_from_still_fails(rules, after):
    diag = run(_server(after), rules)
    assert diag.verdict == "failed"
    assert "KeyError: 'function'" in diag.decisive.line


# ---------------------------------------------------------------- 4. several stages in one log
STAGES = [
    "prefill-1  | INFO 07-01 09:00:00 [api_server.py:1] vLLM API server version 0.10.0",
    "prefill-1  | ERROR 07-01 09:00:30 [core.py:700] EngineCore failed to start.",
    "prefill-1  | ERROR 07-01 09:00:30 [core.py:700] Traceback (most recent call last):",
    'prefill-1  | ERROR 07-01 09:00:30 [core.py:700]   File "/vllm/v1/engine/core.py", line 690, in run_engine_core',
    "prefill-1  | ERROR 07-01 09:00:30 [core.py:700]     engine_core = EngineCoreProc(*args, **kwargs)",
    "prefill-1  | ERROR 07-01 09:00:30 [core.py:700] ValueError: kv_role kv_producer needs kv_connector set",
    "decode-1   | INFO 07-01 09:00:40 [api_server.py:1] vLLM API server version 0.10.0",
    "decode-1   | INFO 07-01 09:01:20 [launcher.py:1] Available routes are:",
    "decode-1   | INFO:     Application startup complete.",
]


def test_a_later_stage_starting_does_not_erase_the_failed_stage(rules):
    diag = run("\n".join(STAGES), rules)
    assert diag.verdict == "failed"
    assert "ValueError: kv_role" in diag.decisive.line
    assert diag.decisive.process and "prefill-1" in diag.decisive.line


def test_the_same_stage_restarting_still_resets(rules):
    restarted = STAGES[:6] + [s.replace("decode-1  ", "prefill-1 ") for s in STAGES[6:]]
    assert run("\n".join(restarted), rules).verdict == "healthy"


def test_rank_tags_are_not_stages(rules):
    text = "[rank0]: ValueError: old run\nINFO:torch.distributed.run:Setting OMP_NUM_THREADS environment variable for each process\n[rank0]: step 1\n"
    assert run(text, rules).verdict == "healthy"


# ---------------------------------------------------------------- 5. wrappers that carry the cause
def test_ray_wrapper_naming_the_task_error_stands_for_it(rules):
    text = "\n".join(
        [
            "    raise value.as_instanceof_cause()",
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::Trainer.fit() (pid=11, ip=10.0.0.1)",
            '  File "/job/trainer.py", line 9, in fit',
            "    out = ray.get(refs)",
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::Rollout.generate() (pid=22, ip=10.0.0.2)",
            '  File "/job/rollout.py", line 30, in generate',
        ]
    )
    dec = run(text, rules).decisive
    assert "ray::Rollout.generate()" in dec.line  # the innermost wrapper, nearest the cause
    assert dec.category == "oom"
    assert "wrapper" in dec.reason


def test_a_wrapper_yields_when_the_cause_is_in_the_log(rules):
    text = "\n".join(
        [
            "ray.exceptions.RayTaskError(KeyError): ray::Loader.load() (pid=11, ip=10.0.0.1)",
            '  File "/job/loader.py", line 3, in load',
            "    return table[key]",
            "KeyError: 'model.embed_tokens.weight'",
        ]
    )
    assert run(text, rules).decisive.line == "KeyError: 'model.embed_tokens.weight'"


# ---------------------------------------------------------------- 6. exception groups and asyncio tasks
def test_exception_group_innermost_sub_exception_decides(rules):
    text = "\n".join(
        [
            "ERROR:    Exception in ASGI application",
            "  + Exception Group Traceback (most recent call last):",
            '  |   File "/venv/lib/python3.12/site-packages/anyio/_backends/_asyncio.py", line 767, in __aexit__',
            "  |     raise BaseExceptionGroup(",
            "  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)",
            "  +-+---------------- 1 ----------------",
            "    | Traceback (most recent call last):",
            '    |   File "/srv/app/handler.py", line 12, in handle',
            "    |     await engine.generate(prompt)",
            "    | RuntimeError: CUDA error: an illegal memory access was encountered",
            "    +------------------------------------",
        ]
    )
    dec = run(text, rules).decisive
    assert dec.line.endswith("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert dec.exception_type == "RuntimeError"
    assert dec.category == "cuda"
    assert any('File "/srv/app/handler.py"' in t for t in dec.traceback)


def test_exception_group_gutter_is_peeled():
    assert parse_line(0, Line(0, "    | KeyError: 'x'")).msg == "KeyError: 'x'"
    assert parse_line(0, Line(0, '  |   File "/a.py", line 1, in f')).msg == '  File "/a.py", line 1, in f'
    assert parse_line(0, Line(0, "  +-+---------------- 2 ----------------")).msg == ""
    assert (
        parse_line(0, Line(0, "  + Exception Group Traceback (most recent call last):")).msg
        == "Traceback (most recent call last):"
    )
    assert parse_line(0, Line(0, "| INFO | app - started")).msg != "INFO | app - started"  # loguru is not a gutter


def test_asyncio_task_exception_never_retrieved(rules):
    text = "\n".join(
        [
            "ERROR:asyncio:Task exception was never retrieved",
            (
                "future: <Task finished name='Task-12' coro=<Scheduler.loop() done, defined at /srv/sched.py:40> "
                "exception=ConnectionRefusedError(111, \"Connect call failed ('10.0.0.3', 29500)\")>"
            ),
            "Traceback (most recent call last):",
            '  File "/srv/sched.py", line 44, in loop',
            "    await self.connect()",
            "ConnectionRefusedError: [Errno 111] Connect call failed ('10.0.0.3', 29500)",
        ]
    )
    dec = run(text, rules).decisive
    assert dec.line.startswith("ConnectionRefusedError: [Errno 111]")
    assert dec.category == "network"


# ---------------------------------------------------------------- 7. timeouts without a culprit
def test_bare_timeout_restated_with_its_message(rules):
    E = "(EngineCore_DP0 pid=9) ERROR 01-29 10:27:47 [core.py:710]"
    text = "\n".join(
        [
            f"{E} EngineCore encountered a fatal error.",
            f"{E} Traceback (most recent call last):",
            f'{E}   File "/vllm/distributed/device_communicators/shm_broadcast.py", line 460, in acquire_read',
            f"{E}     raise TimeoutError",
            f"{E} TimeoutError",
            f"{E} ",
            f"{E} The above exception was the direct cause of the following exception:",
            f"{E} ",
            f"{E} Traceback (most recent call last):",
            f'{E}   File "/vllm/v1/executor/multiproc_executor.py", line 243, in collective_rpc',
            f'{E}     raise TimeoutError(f"RPC call to {{method}} timed out.") from e',
            f"{E} TimeoutError: RPC call to sample_tokens timed out.",
        ]
    )
    dec = run(text, rules).decisive
    assert dec.line.endswith("TimeoutError: RPC call to sample_tokens timed out.")
    assert dec.rule == "rpc-timeout"
    assert "elsewhere" in dec.hint


def test_bare_timeout_alone_is_named_by_the_frame_that_raised_it(rules):
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/vllm/distributed/device_communicators/shm_broadcast.py", line 507, in dequeue',
            "    with self.acquire_read(timeout, cancel) as buf:",
            "TimeoutError",
        ]
    )
    dec = run(text, rules).decisive
    assert dec.line == "TimeoutError"
    assert dec.rule == "rpc-timeout"


def test_a_bare_exception_of_unknown_origin_stays_unnamed(rules):
    text = 'Traceback (most recent call last):\n  File "/srv/x.py", line 3, in f\n    raise TimeoutError\nTimeoutError'
    assert run(text, rules).decisive.rule is None


def test_watchdog_timeout_hint_points_elsewhere(rules):
    text = (
        "[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=880, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600035 milliseconds before timing out."
    )
    dec = run(text, rules).decisive
    assert "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=880" in dec.line
    assert "another host" in dec.hint or "elsewhere" in dec.hint
