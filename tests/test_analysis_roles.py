"""Line roles (DESIGN §14): cause, wrapper, launcher, peer-caused, consequence.

Pure-logic checks of the decision; the same shapes are judged end to end
through ``fleetdiag probe`` in tests/test_corpus_e2e.py.
"""

from __future__ import annotations

import pytest

from fleetdiag.analysis import analyze_text, load_rules


@pytest.fixture(scope="module")
def rules():
    return load_rules(user_default=False)


GLOO_VICTIM = """\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/w/train.py", line 30, in <module>
[rank2]:     dist.all_reduce(t)
[rank2]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:41267
E1201 10:00:01.000000 4242 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0 (pid: 4250) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_10:00:01
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 4250)
============================================================
"""

GLOO_TIMEOUT = GLOO_VICTIM.replace(
    "Connection closed by peer [10.0.0.3]:41267",
    "Timed out waiting 30000ms for recv operation to complete",
)


@pytest.mark.parametrize("text", [GLOO_VICTIM, GLOO_TIMEOUT], ids=["closed-by-peer", "recv-timeout"])
def test_peer_transport_error_beats_launcher_summary(text, rules):
    dec = analyze_text(text, rules=rules).decisive
    assert dec is not None
    assert "gloo/transport/tcp/pair.cc:534" in dec.line
    assert dec.role == "peer-caused"
    assert "blames another process" in dec.reason


def test_local_cause_beats_peer_error(rules):
    text = (
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/w/train.py", line 12, in <module>\n'
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n" + GLOO_VICTIM
    )
    dec = analyze_text(text, rules=rules).decisive
    assert "CUDA out of memory" in dec.line and dec.role == "cause"


def test_launcher_alone_says_so(rules):
    text = "\n".join(GLOO_VICTIM.splitlines()[4:]).replace("exitcode: 1)", "exitcode: -9)")
    text = text.replace("exitcode  : 1 ", "exitcode  : -9 ")
    dec = analyze_text(text, rules=rules).decisive
    assert dec.role == "launcher"
    assert "exitcode: -9" in dec.line
    assert "local rank 0 died with SIGKILL (-9) and wrote no error: see the kernel log" in dec.reason


def test_watchdog_reporting_a_local_cuda_fault_is_a_cause(rules):
    text = (
        "[rank0]:[E1120 14:37:16.000000 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 0] Process group watchdog thread "
        "terminated with exception: CUDA error: an illegal memory access was encountered\n"
    )
    dec = analyze_text(text, rules=rules).decisive
    assert dec.role == "cause" and dec.category == "cuda"


def test_chained_exception_wrapper_never_wins(rules):
    text = """\
Traceback (most recent call last):
  File "/w/a.py", line 3, in load
    open(p)
FileNotFoundError: [Errno 2] No such file or directory: '/models/x/config.json'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/w/a.py", line 9, in <module>
    load()
RuntimeError: could not load the model
"""
    diag = analyze_text(text, rules=rules)
    assert diag.decisive.line.startswith("FileNotFoundError")
    assert diag.decisive.role == "cause"


def test_rule_can_be_disabled_by_id(rules):
    assert "signature:gpu-oom" in rules.rule_ids()
    assert "peer:gloo timeout" in rules.rule_ids()
    less = load_rules(user_default=False, disable=["peer:gloo timeout", "signature:peer-transport"])
    assert "peer:gloo timeout" not in less.rule_ids() and "signature:peer-transport" not in less.rule_ids()
    dec = analyze_text(GLOO_TIMEOUT, rules=less).decisive
    assert dec.role != "peer-caused"


RAY_TASK_OVER_ACTOR_DEATH = """\
Traceback (most recent call last):
  File "/w/main_ppo.py", line 49, in run_ppo
    ray.get(runner.run.remote(config))
  File "/py/ray/_private/worker.py", line 930, in get_objects
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=16209, ip=10.0.0.2, actor_id=af67a3a6)
  File "/w/ray_trainer.py", line 952, in fit
    gen_batch_output = self.actor_rollout_wg.generate_sequences(gen_batch)
  File "/w/base.py", line 49, in func
    output = ray.get(output)
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: WorkerDict
\tpid: 20174
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file.
"""


def test_a_wrapper_quoting_a_cause_the_log_prints_is_not_the_answer(rules):
    """RayTaskError(ActorDiedError) names a type that Ray prints below it: the actor's own cause decides."""
    d = analyze_text(RAY_TASK_OVER_ACTOR_DEATH, rules=rules).decisive
    assert d is not None and "The actor is dead because its worker process has died" in d.line
    assert d.role == "launcher"
    alone = RAY_TASK_OVER_ACTOR_DEATH.split('  File "/w/ray_trainer.py"')[0]  # the wrapper with nothing under it
    d = analyze_text(alone, rules=rules).decisive
    assert d is not None and "RayTaskError(ActorDiedError)" in d.line and d.role == "wrapper"


def _stats(t: str, p: float, g: float, r: int, w: int) -> str:
    return (
        f"INFO 09-18 {t} metrics.py:351] Avg prompt throughput: {p} tokens/s, Avg generation throughput: {g} tokens/s, "
        f"Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: 0.0%, CPU KV cache usage: 0.0%.\n"
    )


HEALTH = 'INFO:     10.0.0.9:4000 - "GET /health HTTP/1.1" 200 OK\n'
ANSWER = 'INFO:     10.0.0.9:4001 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'


def test_an_engine_holding_requests_without_progress_is_stalled(rules):
    hung = _stats("16:10:53", 67.0, 5.0, 2, 0) + HEALTH + _stats("16:10:58", 0.0, 0.0, 3, 4) + HEALTH
    hung += _stats("16:11:03", 0.0, 0.0, 3, 9) + HEALTH
    d = analyze_text(hung, rules=rules)
    assert d.verdict == "stalled" and "engine hung: 2 reports" in d.summary
    # one report is a pause, not a hang; a request answered after the reports is progress
    assert analyze_text(_stats("16:11:03", 0.0, 0.0, 3, 9) + HEALTH, rules=rules).verdict == "healthy"
    assert analyze_text(hung + ANSWER, rules=rules).verdict == "healthy"
    # an idle server reports zeros with nothing held
    idle = "".join(_stats(f"16:1{i}:00", 0.0, 0.0, 0, 0) for i in range(4)) + HEALTH
    assert analyze_text(idle, rules=rules).verdict == "healthy"


# A JIT extension build under torchrun, with and without the compiler's own line (class 1 of #22).
BUILD_UNDER_TORCHRUN = """\
[1/2] /usr/local/cuda/bin/nvcc -c /w/csrc/adam/multi_tensor_adam.cu -o multi_tensor_adam.cuda.o
FAILED: multi_tensor_adam.cuda.o
{compiler}ninja: build stopped: subcommand failed.
[rank0]: Traceback (most recent call last):
[rank0]:   File "/w/torch/utils/cpp_extension.py", line 2104, in _run_ninja_build
[rank0]:     subprocess.run(
[rank0]: subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.
[rank0]: The above exception was the direct cause of the following exception:
[rank0]: Traceback (most recent call last):
[rank0]:   File "/w/train.py", line 9, in <module>
[rank0]: RuntimeError: Error building extension 'fused_adam'
E1201 10:00:01.000000 4242 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0 (pid: 4250) of binary: /usr/bin/python
"""


@pytest.mark.parametrize(
    ("compiler", "decisive", "role"),
    [
        (
            "cc1plus: fatal error: cuda_runtime.h: No such file or directory\ncompilation terminated.\n",
            "cc1plus: fatal",
            "cause",
        ),
        ("", "FAILED: multi_tensor_adam.cuda.o", "wrapper"),
    ],
    ids=["compiler-line", "no-compiler-line"],
)
def test_build_step_wraps_the_compiler_and_beats_the_launcher(compiler, decisive, role, rules):
    """The compiler's own line is the cause; without it the build's first report of the failed step, never torchrun's."""
    dec = analyze_text(BUILD_UNDER_TORCHRUN.format(compiler=compiler), rules=rules).decisive
    assert dec is not None and dec.line.startswith(decisive), dec.line
    assert (dec.role, dec.category, dec.process) == (role, "config", None)
    assert dec.confidence < 0.6 if role == "wrapper" else dec.confidence >= 0.75, dec.confidence


def test_job_runner_report_loses_to_the_raylet(rules):
    """Hydra's 'Error executing job with overrides' (cut mid-line) only says the job failed."""
    text = (
        "(raylet) A worker died or was killed while executing a task by an unexpected system error. Worker exit "
        "type: SYSTEM_ERROR\nError executing job with overrides: ['trainer.n_gpus_per_node=8', 'data.tr\n"
    )
    dec = analyze_text(text, rules=rules).decisive
    assert dec is not None and dec.line.startswith("(raylet) A worker died"), dec.line
    assert dec.role == "launcher"
    alone = analyze_text(text.split("\n", 1)[1], rules=rules).decisive
    assert alone is not None and alone.line.startswith("Error executing job") and alone.role == "wrapper"


def test_open_mpi_return_value_marks_the_step_above_it(rules):
    """The line above '--> Returned ... instead of ...' names the step, whatever its words; alone it is no error."""
    box = "here's some additional information:\n\n  getting local rank failed\n  --> Returned value Not found (-13) instead of ORTE_SUCCESS\n"
    dec = analyze_text("*** An error occurred in MPI_Init\n" + box, rules=rules).decisive
    assert dec is not None and dec.line.strip() == "getting local rank failed"
    assert (dec.role, dec.category) == ("cause", "config")
    assert analyze_text("  getting local rank failed\n  all good\n", rules=rules).decisive is None


# A JVM prints its chain outermost first: the last "Caused by:" is the innermost cause; a concurrent.futures
# remote traceback (the child's own, printed before the parent's re-raise) and mp.spawn's report are wrappers.
_JVM_CHAIN = """\
Exception in thread "main" java.lang.IllegalStateException: model failed to load
\tat ai.example.Loader.load(Loader.java:12)
\tat ai.example.Main.main(Main.java:5)
Caused by: ai.example.EngineException: engine init failed
\tat ai.example.Engine.init(Engine.java:40)
\t... 2 more
Caused by: java.lang.OutOfMemoryError: Java heap space
\tat java.base/java.util.Arrays.copyOf(Arrays.java:3512)
\t... 4 more
"""
_JVM_UNCAUGHT = 'Exception in thread "main" java.lang.ExceptionInInitializerError\n\tat a.B.main(B.java:3)\n'
_REMOTE = """\
concurrent.futures.process._RemoteTraceback:
\"\"\"
Traceback (most recent call last):
  File "/usr/lib/python3.11/concurrent/futures/process.py", line 256, in _process_worker
    r = call_item.fn(*call_item.args, **call_item.kwargs)
  File "/w/prep.py", line 9, in shard
    raise ValueError("shard 3 has no rows")
ValueError: shard 3 has no rows
\"\"\"

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/w/prep.py", line 20, in <module>
    list(pool.map(shard, range(8)))
ValueError: shard 3 has no rows
"""


@pytest.mark.parametrize(
    "text, line",
    [
        (_JVM_CHAIN, "Caused by: java.lang.OutOfMemoryError: Java heap space"),
        (_JVM_UNCAUGHT, 'Exception in thread "main" java.lang.ExceptionInInitializerError'),
        (_REMOTE, "ValueError: shard 3 has no rows"),
    ],
    ids=["jvm-last-caused-by", "jvm-uncaught-no-message", "futures-remote-traceback"],
)
def test_innermost_cause_of_chains_reported_by_another_process_or_runtime(rules, text, line):
    d = analyze_text(text, rules=rules)
    assert d.verdict == "failed" and d.decisive is not None
    assert d.decisive.line == line and d.decisive.role == "cause", (d.decisive.line, d.decisive.role)


# ---- a supervisor's report that its native child exited (issue #22: never healthy, never over the child's error)
_TABBY = (
    "2026-12-01T10:00:01.000001Z  WARN llama_cpp_server::supervisor: crates/llama-cpp-server/src/supervisor.rs:98: "
    'llama-server <chat> exited with status code 1, args: `Command { std: "/usr/local/bin/llama-server" }`\n'
)
_TABBY_RELAY = (
    "2026-12-01T10:00:01.000002Z  WARN llama_cpp_server::supervisor: crates/llama-cpp-server/src/supervisor.rs:110: "
    "<chat>: /usr/local/bin/llama-server: error while loading shared libraries: libcuda.so.1: cannot open shared "
    "object file: No such file or directory\n"
)
_SWAP = "[INFO] <qwen> Starting process\n[WARN] <qwen> ExitError >> signal: aborted (core dumped), exit code: -1\n"
_OLLAMA = (
    'time=2026-12-01T10:00:01.000Z level=ERROR source=sched.go:451 msg="error loading llama server" '
    'error="llama runner process has terminated: signal: killed"\n'
)
_TGI_SIGILL = (
    "2026-12-01T10:00:01.000001Z ERROR shard-manager: text_generation_launcher: Shard process was signaled to "
    "shutdown with signal 4 rank=0\n"
)

# SGLang's server logs its SIGQUIT handler's line with no level ("[time] message")
_SGLANG_SIGQUIT = "[2026-12-01 10:00:01] Received sigquit from a child process. It usually means the child failed.\n"


@pytest.mark.parametrize(
    "text, line, reason, category",
    [
        (_SGLANG_SIGQUIT, "Received sigquit from a child process", "no cause in the lines read", "other"),
        (_TABBY, "exited with status code 1", "a child process exited with code 1 and wrote no error", "other"),
        (_SWAP, "ExitError >> signal: aborted", "died with SIGABRT (-6) and wrote no error", "other"),
        (_OLLAMA, "runner process has terminated: signal: killed", "died with SIGKILL (-9) and wrote no error", "oom"),
        (_TGI_SIGILL, "signaled to shutdown with signal 4", "died with SIGILL (-4) and wrote no error", "other"),
    ],
    ids=[
        "sglang-sigquit-no-level",
        "tabby-status-code",
        "go-exiterror-signal",
        "ollama-runner-killed",
        "tgi-shard-signal-4",
    ],
)
def test_supervisor_report_of_a_silent_child_is_decisive_and_says_so(rules, text, line, reason, category):
    d = analyze_text(text, rules=rules)
    assert d.verdict == "failed" and d.decisive is not None
    assert line in d.decisive.line and d.decisive.role == "launcher"
    assert reason in d.decisive.reason, d.decisive.reason
    assert d.decisive.category == category


def test_child_error_relayed_after_the_supervisor_report_wins(rules):
    d = analyze_text(_TABBY + _TABBY_RELAY, rules=rules)
    assert d.decisive is not None and d.decisive.role == "cause"
    assert "error while loading shared libraries: libcuda.so.1" in d.decisive.line
    assert d.decisive.category == "import"


def test_a_supervisor_line_logged_at_debug_is_not_a_failure(rules):
    # llama-swap logs Go's cmd.Wait() result at DEBUG also when it stopped the child itself (a model swap)
    text = "[DEBUG] <qwen> Process timed out waiting to stop, sending KILL signal\n"
    text += "[DEBUG] <qwen> cmd.Wait() returned error: signal: killed\n"
    assert analyze_text(text, rules=rules).verdict == "healthy"


# ---- an inference server's final "failed to load" summary: decisive only when it is the only error
_TRITON_FINAL = (
    "I1201 10:00:01.000001 1 server.cc:267] Timeout 29: Found 0 live models and 0 in-flight non-inference requests\n"
    "error: creating server: Internal - failed to load all models\n"
)
_TRITON_E = (
    "E1201 10:00:00.900001 1 model_lifecycle.cc:621] failed to load 'yolo' version 1: Internal: unable to create "
    "TensorRT engine\n"
)
_TGI_TB = """\
2026-12-01T10:00:00.000001Z ERROR shard-manager: text_generation_launcher: Shard complete standard error output:

Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/text_generation_server/server.py", line 235, in serve
    model = get_model(
ValueError: Unsupported model type llava_next
 rank=0
2026-12-01T10:00:00.100001Z ERROR text_generation_launcher: Shard 0 failed to start
2026-12-01T10:00:00.100002Z  INFO text_generation_launcher: Shutting down shards
Error: ShardCannotStart
"""


def test_failed_to_load_summary_alone_is_decisive(rules):
    d = analyze_text(_TRITON_FINAL, rules=rules)
    assert d.verdict == "failed" and d.decisive is not None
    assert d.decisive.line == "error: creating server: Internal - failed to load all models"
    assert "a model failed to load" in d.decisive.reason and "wrote no error" not in d.decisive.reason


@pytest.mark.parametrize(
    "text, line",
    [
        (_TRITON_E + _TRITON_FINAL, "failed to load 'yolo' version 1: Internal: unable to create TensorRT engine"),
        (_TGI_TB, "ValueError: Unsupported model type llava_next"),
    ],
    ids=["triton-e-line", "tgi-shard-traceback"],
)
def test_failed_to_load_summary_loses_to_the_load_error_before_it(rules, text, line):
    d = analyze_text(text, rules=rules)
    assert d.decisive is not None and line in d.decisive.line, d.decisive.line
    assert d.decisive.role == "cause"


def test_a_child_the_supervisor_restarted_and_that_serves_again_is_healthy(rules):
    # llama-swap stopping a child at its TTL (or restarting a crashed one) and then answering requests
    text = "[INFO] <qwen> Unloading model, TTL of 300s reached\n"
    text += "[WARN] <qwen> ExitError >> signal: killed, exit code: -1\n"
    text += "".join(
        f'[INFO] Request 10.0.1.135 "POST /v1/chat/completions HTTP/1.1" 200 15667 "axios/1.8.4" 19{k}.3ms\n'
        for k in range(3)
    )
    d = analyze_text(text, rules=rules)
    assert d.verdict == "healthy", (d.verdict, d.decisive)
    assert analyze_text(text.split("[INFO] Request")[0], rules=rules).verdict == "failed"


BARRIER = GLOO_VICTIM.replace(
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:41267",
    "RuntimeError: [Rank 2]: Ranks 5 failed to pass monitoredBarrier in 1800000 ms",
)


def test_a_monitored_barrier_naming_another_rank_is_peer_caused(rules):
    """torch's monitored barrier names the rank that did not arrive: this rank's line, ahead of its launcher's
    summary, is peer-caused (the job analysis looks for rank 5's own error)."""
    d = analyze_text(BARRIER, rules=rules)
    assert d.decisive is not None and "failed to pass monitoredBarrier" in d.decisive.line
    assert d.decisive.role == "peer-caused" and d.decisive.category == "nccl"


NPU_TIMEOUT = """\
(train pid=81) RuntimeError: npuSynchronizeDevice:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:479 NPU function error: AclrtSynchronizeDeviceWithTimeout, error code is 507048
(train pid=81) [ERROR] 2025-06-25-10:45:23 (PID:13075, Device:0, RankID:8) ERR00100 PTA call acl api failed
(train pid=81) [Error]: The execution of the internal task times out.
(train pid=81)         Rectify the fault based on the error information in the ascend log.
(train pid=81) EI0002: [PID: 13075] 2025-06-25-10:45:23.586.187 The wait execution of the Notify register times out. Reason: The Notify register has not received the Notify record from remote rank: [3].
"""


def test_hccls_notify_wait_timeout_under_torch_npus_error_is_decisive_and_peer_caused(rules):
    """torch_npu's generic 'NPU function error', its banner and the error code's stock '[Error]: ' description wrap
    CANN's EI0002 record under them, which says why: the collective waited for a remote rank."""
    d = analyze_text(NPU_TIMEOUT, rules=rules)
    assert d.decisive is not None and d.decisive.lineno == 5
    assert d.decisive.role == "peer-caused" and d.decisive.category == "nccl"


def test_oneccls_record_header_gives_its_level_and_process(rules):
    """oneCCL's '<time>:( pid) |CCL_ERROR| ' header: the record is an error of the pid's process, and the library's
    own: nccl. Its |CCL_WARN| records are not."""
    log = (
        "2024:08:21-10:24:26:( 7746) |CCL_WARN| fallback to 'sockets' mode of ze exchange mechanism\n"
        "2024:08:21-10:24:26:( 4456) |CCL_ERROR| atl_ofi.cpp:243 init: can't find suitable provider\n"
    )
    d = analyze_text(log, rules=rules)
    assert d.decisive is not None and d.decisive.lineno == 2
    assert d.decisive.process == "4456" and d.decisive.category == "nccl"
    assert analyze_text(log.splitlines(keepends=True)[0], rules=rules).verdict != "failed"
