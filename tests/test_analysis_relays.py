"""Errors stated in a form of their own, and the dress relays put on a child's lines (#22).

ggml's abort names its own message at a file:line; a worker's exception quoted on
the line that opens its (cut) traceback is the statement left; a stream logger's
level is the relay's, not the line's; a relay's "[!] " and a progress bar glued
before a rank's record are dress; SGLang's dead scheduler reports its exit code on
the next line.
"""

from __future__ import annotations

from fleetdiag.analysis import analyze_text, load_rules

RULES = load_rules(user_default=False)


def test_ggmls_abort_message_is_decisive_over_the_crash_dump_after_it() -> None:
    log = (
        "llama_new_context_with_model: n_ctx = 2048\n"
        "llama.cpp:11942: The current context does not support K-shift\n"
        "SIGSEGV: segmentation violation\n"
        "PC=0x7f5d m=6 sigcode=1\n"
        "goroutine 7 gp=0xc000 m=6 mp=0xc000 [syscall]:\n"
    )
    d = analyze_text(log, rules=RULES)
    assert d.decisive is not None and "K-shift" in d.decisive.line and d.decisive.category == "config"
    warning = "ggml.c:120: warning: unused variable\nstep 1 loss 2.0\nstep 2 loss 1.9\n"
    assert analyze_text(warning, rules=RULES).decisive is None


def test_a_workers_exception_quoted_before_its_cut_frames_is_decisive() -> None:
    tag = "(VllmWorkerProcess pid=307) ERROR 01-19 03:55:24 multiproc_worker_utils.py:233] "
    log = (
        f"{tag}Exception in worker VllmWorkerProcess while processing method init_device: Cannot re-initialize "
        "CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method, "
        "Traceback (most recent call last):\n"
        f'{tag}  File "/v/worker.py", line 166, in init_device\n'
        f"{tag}    torch.cuda.set_device(self.device)\n"
    )
    d = analyze_text(log, rules=RULES)
    assert d.decisive is not None and "Exception in worker" in d.decisive.line
    assert d.decisive.category == "config" and d.decisive.rule == "cuda-forked"


def test_a_stream_loggers_level_is_the_relays() -> None:
    lines = [f"2024-07-06 02:11:0{i} | ERROR | stderr | " for i in range(3)]
    log = "".join(f"{ln}\nLoading checkpoint shards:  {25 * k}%|██   | {k}/4\n" for k, ln in enumerate(lines, 1))
    assert analyze_text(log, rules=RULES).verdict == "starting"
    boom = log + "2024-07-06 02:11:09 | ERROR | stderr | RuntimeError: CUDA error: out of memory\n"
    d = analyze_text(boom, rules=RULES)
    assert d.decisive is not None and d.decisive.message.startswith("RuntimeError: CUDA error: out of memory")


def test_a_relays_bang_label_is_dress() -> None:
    log = (
        "Download: git clone 'https://example.invalid/node'\n"
        "[!] Traceback (most recent call last):\n"
        '[!]   File "/c/git_helper.py", line 12, in <module>\n'
        "[!]     from comfy.cli_args import args\n"
        "[!] ModuleNotFoundError: No module named 'comfy'\n"
        "[ComfyUI-Manager] Installation failed:\n"
    )
    d = analyze_text(log, rules=RULES)
    assert d.decisive is not None and d.decisive.message == "ModuleNotFoundError: No module named 'comfy'"
    assert d.decisive.category == "import"


def test_a_progress_bar_glued_before_a_ranks_record_is_split_off() -> None:
    rec = (
        "[rank1]:[E1101 17:03:05.823968890 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=395, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600020 "
        "milliseconds before timing out."
    )
    log = f"99%|█████████▉| 23054/23316 [2:22:47<01:34,  2.79it/s]{rec}\n"
    d = analyze_text(log, rules=RULES)
    assert d.decisive is not None and d.decisive.process == "rank1" and d.decisive.category == "nccl"
    assert "progress bar split" in d.decisive.reason


def test_a_dead_schedulers_exit_code_is_decisive() -> None:
    log = (
        "[12-16 14:27:08] Rank 0 scheduler is dead. Please check if there are relevant logs.\n"
        "[12-16 14:27:10] Exit code: -9\n"
        "Traceback (most recent call last):\n"
        '  File "/e/bin/sglang", line 10, in <module>\n'
        "    sys.exit(main())\n"
    )
    d = analyze_text(log, rules=RULES)
    assert d.decisive is not None and d.decisive.line.endswith("Exit code: -9") and d.decisive.category == "oom"
