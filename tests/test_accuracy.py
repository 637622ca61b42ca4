"""bench/accuracy.py as a report in CI: per-set right counts can only go up, no decoy is ever chosen.

The floors are the numbers measured when they were last raised; a change
that loses a case fails here with the case's id.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "accuracy.py"

# set -> the fewest right cases accepted (the present values)
FLOORS = {
    "dev": 21,
    "multinode": 4,
    "tests/corpus": 21,
    # 349 (all, no decoy) since a skipped TensorRT tactic is the lowest tier, a relayed message's escaped lines are
    # unfolded, a front end answering only errors is stalled, a parent's report of a child's exception (mp.spawn's,
    # and its SIGKILL report), a JVM's "Caused by:" chain, prose glued onto a traceback's exception line and
    # pytest's E label are classes (sixteen more cases, each from a source no corpus used); 360 with eleven more:
    # error lines over cut tracebacks, engine deaths behind a request's failure, join timeouts, gateway warm-ups;
    # 367 with seven more: a supervisor's report of its native child's exit, a server's final "failed to load";
    # 374 with seven more: a CI runner's stamp on every line, one compose service's column, a console logger's
    # word-wrapped records, Marian's CUDA checks; 419 with nineteen more: ROCm's native faults, services read
    # from their journal (systemd's report of the main process, a locale's month), Rust servers' panics; 422 with
    # Intel's compute runtime's fatal check; 456 with thirty-four more: llama.cpp's model load and Lightning's sanity
    # check still starting (and past it), an app's logger record over its traceback, Go's crash dump after a native
    # error, glibc's heap check, supervisors that restart, store and mesh transports; 475 with nineteen more: ggml's
    # abort with a message, transformers' shard loading, relays' labels, CUDA in a forked child, a dead scheduler
    # 541 with vLLM's "No available memory for the cache blocks" as memory (oom); 543 with logfmt records' levels,
    # Gin's access log and a supervisor's failed respawn (ollama #9870, #3362); 545 with a log viewer's line chrome
    # and a program's unsupported option (vllm-omni #5208, #5534); 549 with pytest's short test summary lines
    # (TransformerLens #356, xformers #464, TheRock #2396, vLLM #18418); 566 with native libraries' failures at no
    # level (HIP's error names, cuDNN's loader), a checkpoint that does not fit its model and a native program's
    # file it cannot open (seventeen reports, from ffmpeg #395 to llama.cpp #15919); 571 with the CUDA runtime's
    # strings printed bare by native tools (hashcat, deviceQuery, gpu-burn's fabric manager case); 591 of 594 with
    # 23 more of native servers and tools, vLLM V1 and SGLang, and training launchers and peers (three carry
    # known_wrong for their category only)
    "tests/corpus_extra": 591,
    # spent: scored untuned at 9/13, tuned on since (tests/corpus_heldout/README.md)
    "tests/corpus_heldout": 13,
    # the second held-back set, informed since its misses' classes were fixed on other logs
    # (tests/corpus_heldout2/README.md): 23 when first
    # measured, 24 since the abort signature became a weak cause; bench/accuracy.py judges each log
    # through a fresh copy (as just written), so its idle llama-server case reads healthy: 25 (the
    # same file left 600 s old reads `stalled`); 26 since the NCCL heartbeat monitor's lines take the
    # collective-timeout signature (category nccl); 30 since a constant pid label and llama.cpp's uptime
    # stamp are dress, a llama.cpp server's error answer to one task is request-scoped, a toolkit
    # mismatch is config and CUDA's lazy initialisation failure is cuda (each class made on
    # tests/corpus_extra's logs, not on this set); 32 since NCCL's "unhandled cuda error" is cuda in either
    # case and NCCL's transport text is nccl without its WARN head too (made after reading those misses'
    # reasons, on the conventions tests/corpus_extra's logs set: tests/corpus_heldout2/README.md)
    "tests/corpus_heldout2": 32,
    # the third held-back set, never tuned on (tests/corpus_heldout3/README.md): 21 of 27 when first
    # measured (commit 6dfc11b's labels, the analyzer of main at 63b59f6); 23 since a paste's markdown
    # (inline code, fences, block quotes) and a front-end's level/component prefix are dress, 25 since a
    # compiler's or linker's own error inside a build step's output is the cause (the build tool's lines its
    # wrappers) and a job runner's report that the job failed (Hydra's "Error executing job with overrides")
    # is a wrapper (each class made on tests/corpus_extra's logs, this set's cases checked only after); 26 since
    # one package using another's missing API is config by its frames (OpenRLHF #922; informed)
    "tests/corpus_heldout3": 26,
    # the fourth held-back set, never tuned on (tests/corpus_heldout4/README.md): 23 of 31 when first
    # measured (commit d850d30's labels, the analyzer of main at 1f3cc2e), 23 of 30 once a miss whose
    # source another branch tuned on left it; its two Xid 79 kernel logs 2 of 2; 27 since a wrapper that
    # announces the error under it (transformers' lazy import), a native CUDA check's "CUDA Error: ... at
    # file:line", an engine's own hang detector and a launch-layout assertion are classes (made on
    # tests/corpus_extra's logs, this set's four cases checked only after: informed for those classes); 28 since
    # a message relayed inside another (a native library's record in an exception's message, a quoted message's
    # escaped newlines) is unfolded into lines of its own (made on tensorrtllm_backend #712, TensorRT-LLM #2419)
    "tests/corpus_heldout4": 28,
    # the fifth held-back set, never tuned on (tests/corpus_heldout5/README.md): 23 of 35 and 1 decoy when first
    # measured (commit 72896ac's labels, the analyzer of main at 56cd654); its two kernel logs 1 of 2; 27 since a
    # logger's error line over a cut traceback (any header that carries a level), a request's failure after the
    # engine died, and the categories of join timeouts and gateway-answered warm-ups are classes (made on
    # tests/corpus_extra's logs from Ray, vLLM, SGLang, metaseq and PyTorch reports: informed for those classes);
    # 29 since a supervisor's report of its child's exit is a launcher and a server's "failed to load" summary is
    # decisive alone; 31 since a CI runner's stamp, one compose service's column and a console logger's word wrap
    # are dress (all made on tests/corpus_extra's logs: informed, tests/corpus_heldout5/README.md)
    "tests/corpus_heldout5": 31,
    # the sixth held-back set, never tuned on (tests/corpus_heldout6/README.md): 22 of 28 and no decoy when first
    # measured (commit 6214bd5's labels, the analyzer of main at d52494c), 23 once two labels that broke written
    # labelling rules were corrected (their `why` says which); its three kernel logs 3 of 3. 24 since libstdc++'s
    # straight-quoted assertion is a native assertion, 25 since a native allocator's failed allocation is the cause
    # (both made on tests/corpus_extra's logs: informed, its README), 26 since an exception whose whole message is
    # a native record stays one line and TensorRT-LLM's mpiSize == tp * pp check is the launch's layout
    "tests/corpus_heldout6": 26,
    # the seventh held-back set, never tuned on (tests/corpus_heldout7/README.md): 8 of 18 and no decoy when first
    # measured (commits 3d2632f's and 2a8977a's labels, the analyzer of main at 9f7bc28); its two kernel logs 2 of 2.
    # 12 since a native model loader's rejection of the file (unknown architecture, tensor count or shape) is the
    # cause, config (made on tests/corpus_extra's logs from other projects after its miss list named the class:
    # informed for that class, its README); 13 since SGLang's "Received sigquit from a child process", which its
    # logger prints with no level, is a supervisor's report of its child's failure (informed, its README); 15 since
    # a front end coming up (vLLM's route table, uvicorn's server process before its start-up completes) is
    # start-up in progress (made on tests/corpus_extra's club-3090 #747 and strix-halo toolboxes #12); 16 since a
    # wrapper that names what failed (EngineDeadError) ranks above a traceback cut before its exception; 17 since
    # vLLM's per-size graph-capture lines are a start-up (made on tests/corpus_extra's vLLM #23739 and #22897: informed)
    "tests/corpus_heldout7": 17,
    # the eighth held-back set, never tuned on (tests/corpus_heldout8/README.md): 16 of 22 and 3 decoys when first
    # measured (commit 82dbc8e's labels, the analyzer of main at dde47d3), and on main after three classes made
    # without it; 17 since a wrapper that names what failed (EngineDeadError) ranks above a traceback cut before its
    # exception (a class tests/corpus_heldout7's miss list named; this set's miss list showed it too: informed); 19
    # since a native check's `CUDA error (<file>:<line>): <what>` (FlashAttention-3's) is a CUDA error and torchrun's
    # agent's `Received N death signal` is decisive alone (informed for both: made on tests/corpus_extra's logs); 20
    # since an engine finding no memory at all for its KV cache is oom, not the cache's sizing (made on
    # tests/corpus_extra's vllm-backport #15 and vllm-omni #4475: informed); 21 since Gin's access log (ollama's
    # front end) is an access log like uvicorn's, its listing and management requests probes (made on
    # tests/corpus_extra's ollama #9870: informed)
    "tests/corpus_heldout8": 21,
    # the ninth held-back set, never tuned on (tests/corpus_heldout9/README.md): 15 of 24 and 2 decoys when first
    # measured (commit 0f5bbd5's labels, the analyzer of main at da4c52f), and on main after two classes made without it;
    # 17 since a Rust panic's head may carry the thread's id (made on tests/corpus_extra's xinfer logs) and NCCL's
    # return-code lines that name the call are unwinding (made on this set's one log of that form: informed); 18
    # since Intel's compute runtime's "Abort was called at N line in file:" is a native assertion (made on
    # tests/corpus_extra's compute-runtime reports: informed); 19 since a supervisor's report that its child exited is
    # not taken back by the supervisor's own lines after it (made on tests/corpus_extra's journal and restart logs:
    # informed); 20 since Ascend's "Set visible device failed, invalid device" is the devices given, config (made on
    # tests/corpus_extra's vllm-ascend #167: informed); 21 since vLLM's per-size graph-capture lines are a start-up
    # (made on tests/corpus_extra's vLLM #23739 and #22897: informed)
    "tests/corpus_heldout9": 21,
    # the tenth held-back set, never tuned on (tests/corpus_heldout10/README.md): 17 of 24 and 2 decoys when first
    # measured (commit 6130201's labels, the analyzer of main at 40e10b1), and the same on 72dbab4's analyzer; 19 since
    # llama.cpp's model load and Lightning's sanity check are a start-up in progress (made on tests/corpus_extra's
    # logs of those programs from other reports: informed); 20 since ggml's abort with a message of its own is a cause
    # (made on tests/corpus_extra's llama.cpp and ollama reports: informed)
    # 21 since FSDP's and AMP's refusals of a run's dtypes are config (made on tests/corpus_extra's axolotl, peft and
    # Baichuan reports: informed); 22 since an error restated last may be as short as 16 characters (ComfyUI's
    # "Allocation on device": made on this set's own case and tests/corpus_extra's ComfyUI #8016: informed); 23 since
    # xgrammar's "Failed to advance FSM for request …" is one request's (made on tests/corpus_extra's vLLM #22483:
    # informed)
    "tests/corpus_heldout10": 23,
    # the eleventh held-back set, never tuned on (tests/corpus_heldout11/README.md): 15 of 24 and 4 decoys when first
    # measured (commit 0aeb622's labels, the analyzer of main at 8a56a64), and the same on this stop's first analyzer
    # (5eb8475); 19 since transformers' shard loading is a start-up, ggml's abort message a cause, CUDA in a forked
    # child config and SGLang's "Exit code: -9" a kill (each made on tests/corpus_extra's logs of other reports:
    # informed); 20 since a relay's INFO before a child's traceback is no level of the child's lines (made on
    # tests/corpus_extra's fluxgym #383: informed); 21 since the heartbeat monitor's "Terminating the process … due
    # to ProcessGroupNCCL watchdog hang" is the watchdog's timeout, nccl (made on tests/corpus_extra's Fuser #3055)
    "tests/corpus_heldout11": 21,
    # the twelfth held-back set, never tuned on (tests/corpus_heldout12/README.md): 14 of 20 and no decoy when first
    # measured (commit fd375b2's labels, the analyzer of main at fd375b2, and the same answers from this stop's first
    # classes); 15 since transformers' older "Loading 7 checkpoint shards" is a start-up (made on tests/corpus_extra's
    # TorchServe #2569: informed); 17 since NCCL's communicator set-up at the window's end is a start-up and a
    # model config's missing or duplicate field is config (made on tests/corpus_extra's DeepSpeed, transformers,
    # text-embeddings-inference and cake reports: informed); 18 since Open MPI 5's runtime error log ("PRTE ERROR: … in
    # file … at line N") is the ORTE_ERROR_LOG it replaced (made on tests/corpus_extra's ORTE reports: informed)
    "tests/corpus_heldout12": 18,
    # the thirteenth held-back set, never tuned on (tests/corpus_heldout13/README.md): 16 of 20 and no decoy when
    # first measured (commit 1695c18's labels, the analyzer of main at 1695c18); 17 since HCCL's calls named in
    # torch_npu's error ("OPS function error: HcclAllreduce") are the collective library's, nccl (made on
    # tests/corpus_extra's oneCCL and HCCL reports: informed)
    "tests/corpus_heldout13": 17,
    # the fourteenth held-back set, never tuned on (tests/corpus_heldout14/README.md): 19 of 24 and no decoy when
    # first measured (commit d40c7b3's labels, the analyzer of main at d40c7b3); 20 since a program's own "… is not
    # supported" / "only supports …" is config (made on tests/corpus_extra's vllm-omni #5534 and the corpora's labels
    # of such messages: informed)
    "tests/corpus_heldout14": 20,
    # the fifteenth held-back set, never tuned on (tests/corpus_heldout15/README.md): 13 of 22 and no decoy when
    # first measured (commit a2032ff's labels, the analyzer of main at 0fb7cd1); 17 since cuDNN's loader lines,
    # HIP's error names, a checkpoint that does not fit its model and a native program's unopenable file became
    # errors or config (made on tests/corpus_extra's whisper servers, ROCm, Megatron/DeepSpeed/axolotl, libtorch,
    # TensorRT-LLM and llama.cpp reports: informed)
    "tests/corpus_heldout15": 17,
    "tests/corpus_multinode": 61,
    # run where `analyze --kernel` and the kernel corpus's e2e test are present
    "kernel": 17,
    "tests/corpus_kernel": 10,
    "tests/corpus_kernel_extra": 30,
    "tests/corpus_heldout/kernel": 2,
    "tests/corpus_heldout4/kernel": 2,
    # tests/corpus_heldout5's kernel logs: 1 of 2 when first measured, 2 since only a channel's event (the Xid
    # catalog's aftermath: Xid 109) after an application fault is that fault's consequence (informed)
    "tests/corpus_heldout5/kernel": 2,
    "tests/corpus_heldout6/kernel": 3,
    "tests/corpus_heldout7/kernel": 2,
}
# rules (Xid codes apart) that fire on right cases from >= 2 sources: it never drops below this
SUPPORTED_FLOOR = 220
# set -> the most decoys accepted (the present values; every other set: none)
DECOY_CEILINGS: dict[str, int] = {
    "tests/corpus_heldout2": 0,
    "tests/corpus_heldout3": 0,
    "tests/corpus_extra": 0,
    "tests/corpus_heldout4": 0,
    # tests/corpus_heldout5: TGI's empty "Shard complete standard error output:" header is chosen over the shard's
    # signal line (held back: a known-wrong case, not tuned on)
    "tests/corpus_heldout5": 1,
    "tests/corpus_heldout6": 0,
    "tests/corpus_heldout7": 0,
    # tests/corpus_heldout8: axolotl's cut ERROR record over a ChildFailedError's root-cause record (held back: a
    # known-wrong case, not tuned on); 3 when first measured
    "tests/corpus_heldout8": 1,
    # tests/corpus_heldout9: a front end's HTTPException over TensorRT-LLM's assertion (held back: a known-wrong
    # case, not tuned on); 2 when first measured
    "tests/corpus_heldout9": 1,
    # tests/corpus_heldout10: 2 when first measured, 1 (a request's FSM error on a serving vLLM) until xgrammar's
    # "Failed to advance FSM for request …" was read as one request's (made on tests/corpus_extra's vLLM #22483)
    "tests/corpus_heldout10": 0,
    # tests/corpus_heldout11: 4 when first measured, 1 (oneCCL's teardown abort) until oneCCL's own records were read
    # as the library's errors (made on tests/corpus_extra's oneCCL reports)
    "tests/corpus_heldout11": 0,
    # tests/corpus_heldout13: none when first measured; 1 since a C++ test's failed assertion is an error of its own
    # (made on tests/corpus_extra's ROCm test reports): the gtest assertion under RCCL's harness error (held back: a
    # known-wrong case, not tuned on)
    "tests/corpus_heldout13": 1,
}


def _bench():
    spec = importlib.util.spec_from_file_location("fleetdiag_bench_accuracy", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_accuracy_floors(capsys):
    bench = _bench()
    res = bench.report(sweep=True)
    bench._print(res)  # the table goes to the test log as the report
    print(capsys.readouterr().out)
    sets = res["sets"]
    for name, floor in FLOORS.items():
        if name not in sets:  # a shared corpus absent on this machine
            continue
        row = sets[name]
        assert row["right"] >= floor, f"{name}: {row['right']}/{row['total']} < {floor}; wrong: {row['wrong']}"
    for name, row in sets.items():
        most = DECOY_CEILINGS.get(name, 0)
        assert row["decoys"] <= most, f"{name}: {row['decoys']} decoys chosen (at most {most}): {row['wrong']}"
    assert res["support"], "the rule-support sweep found no rules"
    tot = res["totals"]["rules"]
    print(f"rule support totals: {res['totals']}")
    assert tot["total"] == len([r for r in res["support"] if not r.startswith("xid:")])
    assert tot[">=2"] >= SUPPORTED_FLOOR, (
        f"{tot['>=2']} rules fire on cases from >= 2 sources (at least {SUPPORTED_FLOOR}); "
        f"one source now: {[r for r, s in res['support'].items() if s['sources'] == 1 and not r.startswith('xid:')]}"
    )
    wrong = {w for row in sets.values() for w in row["wrong"]}
    for rid, s in res["support"].items():  # a rule fires only on right cases; its sources are theirs
        assert not wrong & set(s["fires"]), f"{rid} counted wrong cases: {wrong & set(s['fires'])}"
        assert s["sources"] == len(s["source_keys"]) <= len(s["fires"]), rid


def test_source_key_one_source_per_issue_and_per_program():
    key = _bench().source_key
    a = key("https://github.com/vllm-project/vllm/issues/16707")
    assert a == key("https://github.com/vllm-project/vllm/issues/16707#issuecomment-2801234567")
    assert a != key("https://github.com/vllm-project/vllm/issues/16708")
    assert key("https://github.com/NVIDIA/nccl/pull/12/files") == key("https://github.com/nvidia/nccl/pull/12")
    blob = "https://github.com/o/r/blob/3f444f1/docs/NOTES.md"
    assert (
        key(blob) == key("https://github.com/o/r/blob/main/docs/NOTES.md#L3") != key("https://github.com/o/r/issues/3")
    )
    rec = "recorded on an H200 host (1x H200, 2026-12-01): a CUDA C++ scatter kernel (illegal_address.cu, CUDA_CHECK macro)"
    assert key(rec) == key(
        "recorded on an H200 host (open module): the same fault (tests/fixtures/device/scripts/rec_1gpu/native/illegal_address.cu)"
    )
    assert key(rec) != key("recorded on an H200 host: a program (illegal_address_32g.cu)")
    assert key("recorded on a 1x H200 host (16 cores): torchrun agents as separate nodes on one host, static") == key(
        "recorded on an H200 host: node 2 of a 4-node gloo torchrun job confined to a 4 GiB memory cgroup"
    )
