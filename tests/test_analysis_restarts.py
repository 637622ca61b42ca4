"""A process's end and its start-up, read from the lines around an error (#22).

A supervisor's report that the program it runs exited stays a failure after the
supervisor's own restart chatter, until the program serves again; a Go runtime's
crash dump after a native error is the process dying, not going on; a start-up
in progress (llama.cpp loading a model, Lightning's sanity check) is `starting`
until a line says it is past it; glibc's heap check names why a process aborted;
bold markdown over several lines of a paste is dress.
"""

from __future__ import annotations

from fleetdiag.analysis import analyze_text, load_rules

RULES = load_rules(user_default=False)

EXIT = "Feb 20 12:27:39 box systemd[1]: app.service: Main process exited, code=exited, status=2/INVALIDARGUMENT\n"
RESTART = (
    "Feb 20 12:27:39 box systemd[1]: app.service: Failed with result 'exit-code'.\n"
    "Feb 20 12:27:42 box systemd[1]: app.service: Scheduled restart job, restart counter is at 1.\n"
    "Feb 20 12:27:42 box systemd[1]: Stopped App.\n"
    "Feb 20 12:27:42 box systemd[1]: app.service: Consumed 6.293s CPU time.\n"
    "Feb 20 12:27:42 box systemd[1]: Started App.\n"
    "Feb 20 12:27:43 box app[170277]: INFO server config env=map[]\n"
)


def test_a_supervisors_exit_report_stands_through_its_restart_chatter() -> None:
    d = analyze_text(EXIT + RESTART, rules=RULES)
    assert d.verdict == "failed" and d.decisive is not None
    assert "Main process exited" in d.decisive.line and d.decisive.role == "launcher"
    assert d.decisive.reason.endswith("; restarted 1 time after it, and nothing served since")
    again = RESTART.replace("counter is at 1", "counter is at 2").replace("170277", "170301")
    d = analyze_text(EXIT + RESTART + EXIT.replace("12:27:39", "12:27:45") + again, rules=RULES)
    assert d.decisive is not None and d.decisive.lineno == 1 and "restarted 2 times after it" in d.decisive.reason


def test_the_restarted_program_serving_again_takes_the_exit_back() -> None:
    served = 'Feb 20 12:27:50 box app[170277]: INFO "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
    d = analyze_text(EXIT + RESTART + served, rules=RULES)
    assert d.verdict == "healthy" and d.decisive is None


GO_DUMP = (
    "Jan 10 16:31:55 node1 ollama[119046]: SIGSEGV: segmentation violation\n"
    "Jan 10 16:31:55 node1 ollama[119046]: PC=0x7cfdb17efe57 m=0 sigcode=1 addr=0x20b203fd0\n"
    "Jan 10 16:31:55 node1 ollama[119046]: signal arrived during cgo execution\n"
    "Jan 10 16:31:55 node1 ollama[119046]: goroutine 19 gp=0xc0001b01c0 m=0 mp=0x5cfc8ff8e1a0 [syscall]:\n"
    "Jan 10 16:31:55 node1 ollama[119046]: runtime.cgocall(0x5cfc8f9a87d0, 0xc000081b90)\n"
    "Jan 10 16:31:55 node1 ollama[119046]: github.com/ollama/ollama/llama._Cfunc_llama_decode(0x7cfd30c5b730)\n"
    "Jan 10 16:31:55 node1 ollama[119046]: created by github.com/ollama/ollama/runner.Execute in goroutine 1\n"
)


def test_a_go_crash_dump_after_a_native_error_is_the_process_dying() -> None:
    cuda = "Jan 10 16:31:55 node1 ollama[119046]: CUDA error: out of memory\n"
    d = analyze_text(cuda + GO_DUMP, rules=RULES)
    assert d.verdict == "failed" and d.decisive is not None
    assert "CUDA error: out of memory" in d.decisive.line and d.decisive.category == "oom"


def test_bold_over_several_lines_is_dress() -> None:
    cuda = "**Jan 10 16:31:55 node1 ollama[119046]: CUDA error: out of memory\n"
    dump = GO_DUMP.replace("segmentation violation\n", "segmentation violation**\n", 1)
    d = analyze_text(cuda + dump, rules=RULES)
    assert d.decisive is not None and d.decisive.message == "CUDA error: out of memory"
    assert "markdown removed" in d.decisive.reason and d.decisive.category == "oom"


LOADING = (
    "0.00.270.696 I srv    load_model: loading model '/models/q4.gguf'\n"
    "0.00.953.358 I load_tensors: offloaded 65/65 layers to GPU\n"
    "0.01.100.000 I llama_context: n_ctx = 65536\n"
    "0.01.200.000 I llama_kv_cache: size = 4096.00 MiB\n"
)


def test_llama_cpp_loading_a_model_is_starting_until_it_listens() -> None:
    assert analyze_text(LOADING, rules=RULES).verdict == "starting"
    up = LOADING + (
        "0.05.000.000 I main: model loaded\n"
        "0.05.000.100 I main: server is listening on http://127.0.0.1:8080 - starting the main loop\n"
    )
    assert analyze_text(up, rules=RULES).verdict == "healthy"
    served = LOADING + "0.09.000.000 I slot print_timing: id  0 | task 3 | n_decoded = 12\n"
    assert analyze_text(served, rules=RULES).verdict == "healthy"


def test_a_sanity_check_is_starting_and_the_first_epoch_is_past_it() -> None:
    summary = "569 M     Total params\n1,138.661 Total estimated model params size (MB)\n"
    assert analyze_text(summary + "Sanity Checking: 0it [00:00, ?it/s]\n", rules=RULES).verdict == "starting"
    epoch = "Epoch 0:   3%|▎         | 12/400 [00:05<02:41,  2.40it/s, v_num=0]\n"
    assert analyze_text(summary + "Sanity Checking: 0it [00:00, ?it/s]\n" + epoch, rules=RULES).verdict == "healthy"


def test_glibcs_heap_check_is_why_the_process_aborted() -> None:
    for msg in ("free(): invalid pointer", "corrupted double-linked list", "double free or corruption (out)"):
        log = f"I0304 01:27:42.698 43331 storage.cpp:134] Reconstructing state\n{msg}\nAborted (core dumped)\n"
        d = analyze_text(log, rules=RULES)
        assert d.verdict == "failed" and d.decisive is not None, msg
        assert d.decisive.line == msg and d.decisive.category == "other"
    d = analyze_text("tensor free(): called on a view, skipped\nstep 10 loss 0.5\n", rules=RULES)
    assert d.decisive is None or "free()" not in d.decisive.line


def _prompt_fails_twice(msg: str) -> str:
    """A ComfyUI-style server: the first prompt's traceback, a later prompt failing with the same message last."""
    return (
        "2024-09-11 11:20:01,000 - root - INFO - got prompt\n"
        "Traceback (most recent call last):\n"
        '  File "/app/execution.py", line 317, in execute\n'
        "    output_data = get_output_data(obj, input_data_all)\n"
        f"torch.OutOfMemoryError: {msg}\n"
        "2024-09-11 11:23:13,602 - root - INFO - Prompt executed in 296.92 seconds\n"
        "2024-09-11 11:50:30,102 - root - INFO - got prompt\n"
        "2024-09-11 11:50:30,198 - root - INFO - Requested to load Flux\n"
        f"2024-09-11 11:51:36,769 - root - ERROR - !!! Exception during processing !!! {msg}\n"
    )


def test_an_error_restated_as_the_last_output_keeps_its_first_statement() -> None:
    d = analyze_text(_prompt_fails_twice("Allocation on device"), rules=RULES)
    assert d.verdict == "failed" and d.decisive is not None
    assert d.decisive.lineno == 5 and d.decisive.category == "oom"
    assert "failed the same way again (line 9)" in d.decisive.reason
    # a message this short is not told apart from another error's: the restatement is not tied to the first
    d = analyze_text(_prompt_fails_twice("out of mem x"), rules=RULES)
    assert d.decisive is not None and "failed the same way again" not in d.decisive.reason
