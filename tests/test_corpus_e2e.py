"""Every single-host corpus case end to end: ``fleetdiag probe`` over a real sshd.

One sshd, one inventory with a host entry per case (each host's ``logs:``
pointing at that case's file), one ``probe all --json`` and one
``probe all --all-cards`` for the whole set; then, per case, the verdict and
the decisive line are asserted in the JSON and on the card. Sets: tests/corpus,
tests/corpus_extra, tests/corpus_heldout, tests/corpus_heldout2, tests/corpus_heldout3, tests/corpus_heldout4,
tests/corpus_heldout5, tests/corpus_heldout6, tests/corpus_heldout7, tests/corpus_heldout8, tests/corpus_heldout9, tests/corpus_heldout10, tests/corpus_heldout11, tests/corpus_heldout12, tests/corpus_heldout13, tests/corpus_heldout14, tests/corpus_heldout15, and every node of the multinode
corpora (shared/corpus/multinode, tests/corpus_multinode) judged as a single
host: the root node's own error, a victim's own peer-caused line. The kernel
corpus has its own end-to-end test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.cli import main

BENCH = Path(__file__).resolve().parents[1] / "bench" / "accuracy.py"


def _bench():
    spec = importlib.util.spec_from_file_location("fleetdiag_bench_accuracy", BENCH)
    assert spec is not None and spec.loader is not None
    mod = sys.modules.get(spec.name)
    if mod is None:
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return mod


def _cases():
    sets = _bench().all_sets()
    out = []
    for name in (
        "tests/corpus",
        "tests/corpus_extra",
        "tests/corpus_heldout",
        "tests/corpus_heldout2",
        "tests/corpus_heldout3",
        "tests/corpus_heldout4",
        "tests/corpus_heldout5",
        "tests/corpus_heldout6",
        "tests/corpus_heldout7",
        "tests/corpus_heldout8",
        "tests/corpus_heldout9",
        "tests/corpus_heldout10",
        "tests/corpus_heldout11",
        "tests/corpus_heldout12",
        "tests/corpus_heldout13",
        "tests/corpus_heldout14",
        "tests/corpus_heldout15",
        "multinode",
        "tests/corpus_multinode",
    ):
        out += sets.get(name, [])
    return out


CASES = _cases()
LOG_AHEAD_S = 3600.0  # the logs' mtime ahead of the clock (the probes take minutes)
HOSTS = {c.id: f"c{i:03d}" for i, c in enumerate(CASES)}


# tests/corpus_heldout cases the analyzer gets wrong (the set is spent: it was scored untuned at 9/13 and
# has been tuned on since; tests/corpus_heldout2 is held back); strict, so a fix that makes one pass is noticed
HELDOUT_KNOWN_WRONG: set[str] = set()


# the second held-back set (tests/corpus_heldout2/README.md: nobody tunes on it): each case the
# analyzer gets wrong, with its actual answer as the reason. "json" marks a miss only the JSON
# judgement sees (a wrong category, or a wrong line while the card still shows the labelled one
# among its context lines); "both" a wrong verdict or line that the card shows too. Strict: a general fix that makes one pass
# is noticed, and its entry goes (with the floor in tests/test_accuracy.py raised).
HELDOUT2_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "megatron_bridge_650_mpi_init_thread_fatal_banner": (
        "json",
        "line right (Open MPI's MPI_Init_thread banner, the window's only statement), category config "
        "(labelled other): tests/corpus_extra's convention makes an MPI start-up failure config; this "
        "set's labels are not changed after scoring",
    ),
    # not listed: llamacpp_ramalama_1914 reads healthy here and in bench/accuracy.py (both judge a
    # fresh copy of each log) but `stalled` when its file is older than the 600 s stall window:
    # the idle llama-server's "all slots are idle" / "waiting for new tasks" is not known as idle
}


# the third held-back set (tests/corpus_heldout3/README.md: nobody tunes on it), in the same form as
# HELDOUT2_KNOWN_WRONG: each case the analyzer got wrong when the set was first scored, with its answer.
HELDOUT3_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "trtllm_backend_710_triton_one_line_escaped_newlines_lookahead": (
        "json",
        "line right, category other (labelled config): Triton's lookahead-decoding assertion '16 != 40'",
    ),
}


# the fourth held-back set (tests/corpus_heldout4/README.md: nobody tunes on it), in the same form: each
# case the analyzer got wrong when the set was first scored (labels of d850d30, the analyzer of main at
# 1f3cc2e), with its answer.
HELDOUT4_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "nccl_tests_217_single_gpu_socket_closed_by_remote_peer": (
        "json",
        "line right, category nccl (labelled network) and role peer-caused: 'NCCL WARN socketProgress: "
        "Connection closed by remote peer localhost'",
    ),
    "nccl_tests_294_bootstrap_address_family_neither_inet": (
        "json",
        "line right, category nccl (labelled network): NCCL's 'connecting to address with family 33621 is "
        "neither AF_INET(2) nor AF_INET6(10)'",
    ),
}


# the fifth held-back set (tests/corpus_heldout5/README.md: nobody tunes on it), in the same form: each
# case the analyzer got wrong when the set was first scored (labels of 72896ac, the analyzer of main at
# 56cd654), with its answer; "both" where the card does not show the labelled line either.
HELDOUT5_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "other_tabbyapi_465_compose_rich_indented_cuda_host_register_invalid": (
        "json",
        "line right, category other (labelled cuda): 'RuntimeError: cudaHostRegister(...)' whose 'failed: "
        "invalid argument' is wrapped onto the next line",
    ),
    "other_tgi_1627_shard_signal_4_cannot_start": (
        "both",
        "a decoy: TGI's 'Shard complete standard error output:' header (empty) over the signal line 'Shard "
        "process was signaled to shutdown with signal 4 rank=0'",
    ),
    "other_xinference_3135_failed_to_launch_model_detail_keyerror_two_lines": (
        "json",
        "line right, category other (labelled python): Xinference's 'Failed to launch model, detail: [...] "
        "'reasoning_content'' quoting a bare KeyError",
    ),
    "torch_msswift_6107_quoted_rank10_nccl_error_then_ibv_reg_mr_warn": (
        "both",
        "the rank's 'RuntimeError: NCCL Error 2: unhandled system error' with category other, not NCCL's "
        "own WARN under it ('Call to ibv_reg_mr_iova2 failed with error Invalid argument', nccl)",
    ),
}


# the sixth held-back set (tests/corpus_heldout6/README.md: nobody tunes on it), in the same form: each
# case the analyzer got wrong when the set was first scored (labels of 6214bd5, two of them corrected
# since to the written labelling rules; the analyzer of main at d52494c), with its answer; "both" where
# the card does not show the labelled line either.
HELDOUT6_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "sglang_36333_state_deleted_then_health_check_failed_detokenizer_20s": (
        "both",
        "healthy (starting): SGLang's repeated 'Health check failed. Server couldn't get a response from "
        "detokenizer for last 20 seconds.' after the orphan request's notices is not read as a failure",
    ),
    "tensorrt_llm_9263_failed_to_initialize_executor_rank0_nccl_invalid_usage_record": (
        "json",
        "line right, category other (labelled nccl): the relayed '[TensorRT-LLM][ERROR] Assertion failed: Failed, "
        "NCCL error .../ncclCommunicator.cpp:90 'invalid usage (run with NCCL_DEBUG=WARN for details)''",
    ),
}


# the seventh held-back set (tests/corpus_heldout7/README.md: nobody tunes on it), in the same form: each case the
# analyzer got wrong when the set was first scored (labels of 3d2632f and 2a8977a, the analyzer of main at 9f7bc28),
# with its answer; "both" where the card does not show the labelled line or verdict either.
HELDOUT7_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "vllm_27194_bracket_residue_output_handler_engine_dead_stream": (
        "both",
        "the output handler's first frame line ('... [async_llm.py:485[]   File \".../async_llm.py\", line 444, in "
        "output_handler', the logger's ']' pasted as '[]') with category other, not the EngineDeadError under it",
    ),
}


# the eighth held-back set (tests/corpus_heldout8/README.md: nobody tunes on it), in the same form: each case the
# analyzer got wrong when the set was first scored (labels of 82dbc8e, the analyzer of main at dde47d3), with its
# answer; "both" where the card does not show the labelled line or verdict either.
HELDOUT8_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "torch_axolotl_2791_childfailed_no_other_failures_rank1_then_empty_error_line": (
        "both",
        "a decoy: axolotl's ERROR record cut after its prefix ('[2025-06-18 04:34:34,298] [ERROR] "
        "[axolotl.cli.main.train:182] [PID:113411] [RANK:0]') over the ChildFailedError's root-cause record "
        "'exitcode  : 1 (pid: 113422)'",
    ),
}

# the ninth held-back set (tests/corpus_heldout9/README.md: nobody tunes on it), in the same form: each case the
# analyzer got wrong when the set was first scored (labels of 0f5bbd5, the analyzer of main at da4c52f), with its
# answer. Five are right since (informed, tests/corpus_heldout9/README.md): NCCL's return-code lines that name the
# call are unwinding, a Rust panic's head may carry the thread's id, a launcher's summary read as a consequence
# says who died of what, Python's CalledProcessError is a launcher's report, and Intel's compute runtime's
# "Abort was called at N line in file:" is a native assertion.
HELDOUT9_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "tensorrt_llm_5451_briton_http_500_traceback_then_executor_decoder_finished_event_assert": (
        "both",
        "a decoy: the front end's 'fastapi.exceptions.HTTPException: 500: Briton error during inference' over "
        "TensorRT-LLM's '[TensorRT-LLM][ERROR] Assertion failed: decoderFinishedEvent must be nullopt.'",
    ),
    "torch_llamafactory_8261_line_numbered_progress_bar_glued_rank5_watchdog_cut": (
        "json",
        "line right since a progress bar glued before a rank's record is split off (healthy when first scored), "
        "category other: the record is cut at 'Watchdog caught collective operati', before any signature's text",
    ),
    "vllm_omni_1029_ci_pipe_column_stage1_engine_dead_then_failed_on_request": (
        "both",
        "the stage's cut 'Traceback (most recent call last):' under a CI log's '  | ' column and vllm-omni's "
        "'[Stage-1] ' label over the front end's EngineDeadError",
    ),
}

# the tenth held-back set (tests/corpus_heldout10/README.md: nobody tunes on it), in the same form: each case the
# analyzer got wrong when the set was first scored (labels of 6130201, the analyzer of main at 40e10b1, and the
# same answers from the analyzer of 72dbab4), with its answer.
HELDOUT10_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "sglang_4205_capture_cuda_graph_failed_gloo_pair_connection_closed_peer_cut": (
        "json",
        "line right, category other and role cause: SGLang's 'Exception: Capture cuda graph failed: [...gloo "
        "pair.cc:534] Connection cl' (cut) is not read as gloo's peer-caused transport error",
    ),
}

# the eleventh held-back set (tests/corpus_heldout11/README.md: nobody tunes on it), in the same form: each case the
# analyzer got wrong when the set was first scored (labels of 0aeb622, the analyzer of main at 8a56a64, and the same
# answers from this stop's analyzer), with its answer.
HELDOUT11_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "sglang_5594_multinode_nccl_connect_abort": (
        "json",
        "line right, category network (labelled nccl): NCCL's 'socketStartConnect: Connect to … failed : Software "
        "caused connection abort'",
    ),
    "vllm_llm-scaler_432_worker_failed_ur_out_of_resources": (
        "json",
        "line right, category other (labelled oom): the engine core's 'Worker failed with error 'level_zero backend "
        "failed with error: 40 (UR_RESULT_ERROR_OUT_OF_RESOURCES)''",
    ),
    "vllm_llm-scaler_672_compose_worker0_died_ccl_teardown": (
        "both",
        "a decoy when first scored: oneCCL's 'what():  oneCCL: pmi_resizable_simple_internal.cpp:363 … failed' at "
        "teardown over the executor's 'Worker proc VllmWorker-0 died unexpectedly, shutting down executor.'; since "
        "oneCCL's own records are read as the library's errors, its earlier '|CCL_ERROR| internal_kvs.cpp:94 "
        "kvs_remove_name_key' at the same teardown",
    ),
}

# the twelfth held-back set (tests/corpus_heldout12/README.md: nobody tunes on it), in the same form: each case the
# analyzer got wrong when the set was first scored (labels of fd375b2, the analyzer of main at fd375b2), with its
# answer.
HELDOUT12_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "sglang_8131_sgl_kernel_undefined_symbol_green_ctx": (
        "json",
        "line right, category config (labelled import): the kernel library's 'ImportError: … undefined symbol: "
        "cuGreenCtxStreamCreate'",
    ),
    "torch_xtuner_719_rank1_monitored_barrier_gloo_closed_by_peer": (
        "json",
        "the monitored barrier's 'RuntimeError: Rank 1 successfully reached monitoredBarrier, but received errors …' "
        "over the gloo 'Connection closed by peer' it carries (labelled network)",
    ),
}

# the thirteenth held-back set (tests/corpus_heldout13/README.md: nobody tunes on it), in the same form: each case the
# analyzer got wrong when the set was first scored (labels of 1695c18, the analyzer of main at 1695c18), with its
# answer.
HELDOUT13_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "nccl_rccl_1370_gtest_ncclgroupend_code1": (
        "both",
        "healthy (labelled failed) when first scored: RCCL's gtest '[ ERROR    ] Child process 0 fails NCCL call "
        "ncclGroupEnd with code 1' is not read as an error; since a C++ test's failed assertion is an error of its own, "
        "the assertion 'TestBed.cpp:183: Failure' after it is chosen (a decoy)",
    ),
    "other_lmdeploy_ascend_54_acl_stream_sync_hccl_timeout": (
        "json",
        "line right, category other (labelled nccl): 'RuntimeError: ACL stream synchronize failed.' over CANN's "
        "'EI9999 … hccl fftsplus task timeout'",
    ),
    "sglang_torch_memory_saver_35_curesult_resume": (
        "both",
        "healthy (labelled failed): torch_memory_saver's '[torch_memory_saver.cpp] CUresult error  result=1 … "
        "func=resume line=214' is not read as an error",
    ),
}

# the fourteenth held-back set (tests/corpus_heldout14/README.md: nobody tunes on it), in the same form: each case the
# analyzer got wrong when the set was first scored (labels of d40c7b3, the analyzer of main at d40c7b3), with its
# answer.
HELDOUT14_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "accelerate_yarn_35_deepspeed_prepare_needs_dataloader_then_elastic_exit1": (
        "json",
        "line right, category python (labelled config): accelerate's 'ValueError: When using DeepSpeed "
        "`accelerate.prepare()` requires you to pass at least one of training or evaluation dataloaders …'",
    ),
    "llamacpp_llamafile_682_gguf_tensor_type_assert_sigabrt": (
        "json",
        "line right, category other (labelled config): ggml's 'GGML_ASSERT(0 <= info->type && info->type < "
        "GGML_TYPE_COUNT) failed' on a model file whose tensor type the build does not know",
    ),
    "llamacpp_ollama_1703_journald_runner_terminated_then_gin_200s": (
        "both",
        "healthy (labelled failed): ollama's 'error starting llama runner: llama runner process has terminated' "
        "followed by [GIN] 200 answers",
    ),
    "vllm_omni_946_buildkite_pipe_column_no_kv_cache_memory": (
        "both",
        "a traceback frame line under Buildkite's '  | ' column, 'File \"/usr/lib/python3.12/multiprocessing/"
        "process.py\", line 108, in run', over the engine's 'ValueError: No available memory for the cache blocks.'",
    ),
}

# the fifteenth held-back set (tests/corpus_heldout15/README.md: nobody tunes on it), in the same form: each case the
# analyzer got wrong when the set was first scored (labels of a2032ff, the analyzer of main at 0fb7cd1), with its
# answer, less the four that classes made on tests/corpus_extra's logs of other reports put right since (cuDNN's
# loader, HIP's error names, a checkpoint that does not fit its model, a native program's file it cannot open).
HELDOUT15_KNOWN_WRONG: dict[str, tuple[str, str]] = {
    "deepspeed_6875_hostfile_2node_rank4_nccl_remote_error_net_ib_completion": (
        "json",
        "line right, category nccl (labelled network): NCCL's 'NET/IB: Got completion from peer … with status=5 … "
        "vendor err 249 (Recv)' on a two-node job's rank 4",
    ),
    "other_llmc_85_train_gpt2cu_wsl_no_cuda_device": (
        "json",
        "line right since the runtime's bare no-device string became an error at any level (first: healthy), "
        "category config (labelled cuda): a CUDA program's 'no CUDA-capable device is detected'",
    ),
    "ray_ttrl_20_verl_taskrunner_raytaskerror_wraps_reward_model_keyerror": (
        "json",
        "line right, category python (labelled config): the remote 'KeyError: 'reward_model'' under Ray's task error",
    ),
    "sglang_165_low_mem_fraction_req_pool_indices_none": (
        "json",
        "line right, category python (labelled config): 'AttributeError: 'NoneType' object has no attribute 'cpu'' "
        "after a lowered --mem-fraction-static",
    ),
    "vllm_ppc64le_8270_gha_timestamps_cpu_reserved_assert": (
        "json",
        "line right, category python (labelled config): the engine core's 'AssertionError: VLLM_CPU_NUM_OF_RESERVED' "
        "under GitHub Actions' timestamps",
    ),
}

HELD_BACK = {
    "tests/corpus_heldout2": HELDOUT2_KNOWN_WRONG,
    "tests/corpus_heldout3": HELDOUT3_KNOWN_WRONG,
    "tests/corpus_heldout4": HELDOUT4_KNOWN_WRONG,
    "tests/corpus_heldout5": HELDOUT5_KNOWN_WRONG,
    "tests/corpus_heldout6": HELDOUT6_KNOWN_WRONG,
    "tests/corpus_heldout7": HELDOUT7_KNOWN_WRONG,
    "tests/corpus_heldout8": HELDOUT8_KNOWN_WRONG,
    "tests/corpus_heldout9": HELDOUT9_KNOWN_WRONG,
    "tests/corpus_heldout10": HELDOUT10_KNOWN_WRONG,
    "tests/corpus_heldout11": HELDOUT11_KNOWN_WRONG,
    "tests/corpus_heldout12": HELDOUT12_KNOWN_WRONG,
    "tests/corpus_heldout13": HELDOUT13_KNOWN_WRONG,
    "tests/corpus_heldout14": HELDOUT14_KNOWN_WRONG,
    "tests/corpus_heldout15": HELDOUT15_KNOWN_WRONG,
}


def _xfail(case, test: str = "json") -> list:
    if case.set == "tests/corpus_heldout" and case.id in HELDOUT_KNOWN_WRONG:
        return [pytest.mark.xfail(reason="tests/corpus_heldout: known wrong", strict=True)]
    if case.set in HELD_BACK:
        known = HELD_BACK[case.set]
        where, why = known.get(case.id, ("", ""))
        if where == "both" or where == test:
            return [pytest.mark.xfail(reason=f"held back (never tuned on), known wrong: {why}", strict=True)]
        return []
    lab = case.log.with_suffix(".json")
    why = json.loads(lab.read_text()).get("known_wrong") if lab.is_file() else None
    if isinstance(why, dict):  # per test: a wrong line or verdict (both tests), or a category (the JSON test's only)
        own = {"json": "test_json_verdict_and_decisive_line", "card": "test_card_verdict_and_decisive_line"}
        why = why.get("test_decisive_line") or why.get(own.get(test, ""))
    return [pytest.mark.xfail(reason=why, strict=True)] if why else []


PARAMS = [pytest.param(c, id=f"{c.set}:{c.id}", marks=_xfail(c)) for c in CASES]


def _reason_has(case) -> str | None:
    lab = case.log.with_suffix(".json")
    return json.loads(lab.read_text()).get("reason_has") if lab.is_file() else None


# cases whose label says what the card must say of the decisive line (a launcher's report of a child
# that wrote no error: "rank 3 died with SIGKILL (-9) and wrote no error: see the kernel log")
REASON_PARAMS = [
    pytest.param(c, id=f"{c.set}:{c.id}", marks=_xfail(c, "reason") if c.set in HELD_BACK else [])
    for c in CASES
    if _reason_has(c)
]
CARD_PARAMS = [pytest.param(c, id=f"{c.set}:{c.id}", marks=_xfail(c, "card")) for c in CASES]


@pytest.fixture(scope="module")
def probed(sshd, tmp_path_factory):
    """(JSON hosts by name, card text by name) for every case, from two probe invocations."""
    tmp = tmp_path_factory.mktemp("e2e")
    lines = ["hosts:"]
    for c in CASES:
        host = HOSTS[c.id]
        log = tmp / host / "app.log"
        log.parent.mkdir()
        log.write_bytes(c.log.read_bytes())
        # a pasted log has no "now": it reads as just written for as long as the probe of every case takes
        # on a loaded machine, so its age never turns a log that ends while starting into a stall
        os.utime(log, (time.time() + LOG_AHEAD_S, time.time() + LOG_AHEAD_S))
        lines += [
            f"  {host}:",
            "    address: 127.0.0.1",
            f"    port: {sshd.port}",
            f"    user: {sshd.user}",
            "    logs:",
            f"      app: {json.dumps(str(log))}",
        ]
    inv = tmp / "inventory.yaml"
    inv.write_text("\n".join(lines) + "\n")
    common = [
        *sshd.cli_args(),
        "--no-stacks",
        # a loaded CI machine: generous limits, few handshakes at once (one sshd serves every host)
        "--fanout",
        "8",
        "--connect-timeout",
        "60s",
        "--timeout",
        "120s",
        "--workers",
        "1",
    ]
    env = {"COLUMNS": "400", "XDG_CONFIG_HOME": str(tmp / "config")}
    r = CliRunner().invoke(main, ["-i", str(inv), "probe", "all", "--json", *common], env=env)
    assert r.exit_code in (0, 1), r.output[-3000:]
    doc = json.loads(r.output)
    hosts = {h["host"]: h for h in doc["hosts"]}
    t = CliRunner().invoke(main, ["-i", str(inv), "--no-color", "probe", "all", "--all-cards", *common], env=env)
    assert t.exit_code in (0, 1), t.output[-3000:]
    cards = _cards(t.output)
    assert set(cards) == set(hosts), sorted(set(hosts) ^ set(cards))[:10]  # every host's card was found by its title
    return hosts, cards


_TITLE = re.compile(r"^╭─+\s+\S+\s+(c\d{3,})\s")


def _cards(text: str) -> dict[str, str]:
    """The text of each host's card, by host name (a card starts with its titled top border)."""
    out: dict[str, str] = {}
    cur: str | None = None
    for line in text.splitlines():
        m = _TITLE.match(line)
        if m:
            cur = m.group(1)
            out[cur] = ""
        if cur is not None:
            out[cur] += line + "\n"
    return out


def _squash(s: str) -> str:
    """Text without whitespace and box drawing: a card wraps long lines wherever it must (and shows a
    host's tab as the visible ``\\t``, so both forms count as whitespace here)."""
    return re.sub(r"(?:[\s│╭╮╰╯─]|\\t)+", "", s)


def test_every_case_has_a_host():
    assert len(CASES) >= 60 and len(set(HOSTS.values())) == len(CASES)


@pytest.mark.parametrize("case", PARAMS)
def test_json_verdict_and_decisive_line(case, probed):
    hosts, _ = probed
    h = hosts[HOSTS[case.id]]
    dec = h.get("decisive") or {}
    verdict = "failed" if h["verdict"] == "failed" else h["verdict"]
    got = _bench().judge(case, verdict, dec.get("line"), dec.get("role"), dec.get("category"))
    assert got == "right", (
        h["verdict"],
        h.get("error"),
        dec.get("line"),
        dec.get("role"),
        dec.get("category"),
        case.accepted,
    )
    assert "role" in dec or case.verdict != "failed"


@pytest.mark.parametrize("case", CARD_PARAMS)
def test_card_verdict_and_decisive_line(case, probed):
    hosts, cards = probed
    host = HOSTS[case.id]
    card = cards.get(host)
    assert card is not None, f"no card for {host}"
    title = card.splitlines()[0]
    assert case.verdict.upper() in title or (case.verdict == "healthy" and "HEALTHY" in title), title
    if case.verdict != "failed":
        return
    line = hosts[host]["decisive"]["line"]
    assert _squash(line)[-60:] in _squash(card), card
    if case.accepted:
        assert any(_squash(a) in _squash(card) for a in case.accepted), card
    if case.role is not None:
        assert case.role in card


@pytest.mark.parametrize("case", REASON_PARAMS)
def test_reason_in_json_and_on_card(case, probed):
    """What the user reads of a launcher-only failure: the child wrote no error, where to look next."""
    hosts, cards = probed
    host = HOSTS[case.id]
    want = _reason_has(case)
    assert want in (hosts[host]["decisive"] or {}).get("reason", ""), hosts[host]["decisive"]
    assert _squash(want) in _squash(cards[host]), cards[host]
