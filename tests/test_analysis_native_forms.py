"""Native programs' failure forms the analyzer reads as lines of their own (issue #22, class 2 and 3).

Pure logic on short texts in the shapes real programs print (the real logs are tests/corpus_extra's
`other_mistralrs_*`, `other_candle_*`, `other_tower_http_*`, `other_onnxruntime_*`, `other_tensorrt_*`,
`nccl_deepep_*` and `torch_pytorch_150916_*` cases, proven through the CLI in tests/test_corpus_e2e.py).
"""

from __future__ import annotations

from fleetdiag.analysis import analyze_text


def _dec(text: str):
    d = analyze_text(text)
    assert d.verdict == "failed", d.summary
    assert d.decisive is not None
    return d.decisive


def test_rust_panic_message_on_the_next_line_is_decisive() -> None:
    dec = _dec(
        "INFO model loaded\n"
        "thread 'main' panicked at src/engine.rs:88:14:\n"
        'called `Result::unwrap()` on an `Err` value: DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")\n'
        "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
    )
    assert dec.line.startswith("called `Result::unwrap()`")
    assert dec.exception_type is None
    assert dec.category == "oom"
    assert dec.traceback[0].startswith("thread 'main' panicked at src/engine.rs:88:14:")


def test_rust_panic_of_the_older_one_line_form_and_in_markdown() -> None:
    old = _dec("thread 'tokio-runtime-worker' panicked at 'index out of bounds', router/src/infer.rs:598:14\n")
    assert old.line.startswith("thread 'tokio-runtime-worker' panicked at 'index out of bounds'")
    bold = _dec("**thread 'main' panicked at src/main.rs:3:9:\nno model named foo**\nstack backtrace:\n   0: x\n")
    assert bold.line == "no model named foo**"


def test_an_exception_whose_message_runs_on_takes_the_category_of_the_rest() -> None:
    dec = _dec(
        "RuntimeException: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while "
        "running Conv node. Name:'c1' Status Message: \n"
        "bfc_arena.cc:376 AllocateRawInternal Failed to allocate memory for requested buffer of size 1024\n"
    )
    assert dec.line.startswith("RuntimeException: [ONNXRuntimeError]")
    assert dec.category == "oom"


def test_tensorrt_bracketed_level_letter_is_an_error_level() -> None:
    d = analyze_text(
        "[05/21/2024-16:18:49] [I] Loading\n[05/21/2024-16:18:49] [E] Error[2]: [x.cpp::f::1] Error Code 2\n"
    )
    assert d.decisive is not None and "Error Code 2" in d.decisive.line
    assert analyze_text("[05/21/2024-16:18:49] [I] Error correction: on\n").verdict == "healthy"


def test_a_levelless_nccl_remote_error_loses_to_the_ranks_own_transport_line() -> None:
    dec = _dec(
        "  what():  [Rank 1] Process group watchdog thread terminated with exception: NCCL error: remote process "
        "exited or there was a network error, NCCL version 2.21.5\n"
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
        "Last error:\n"
        "socketProgress: Connection closed by remote peer node-2<59116>\n"
    )
    assert dec.line.startswith("socketProgress: Connection closed by remote peer")
    assert dec.role == "peer-caused"
    alone = _dec("ith exception: NCCL error: remote process exited or there was a network error, NCCL version 2.20.5\n")
    assert alone.role == "peer-caused" and alone.category == "nccl"


def test_an_assertion_in_each_quoting_of_its_runtime_is_decisive_and_glib_criticals_are_not() -> None:
    """glibc quotes the check `x', libstdc++'s _GLIBCXX_ASSERTIONS 'x', a translated glibc ‘x’, a device-side
    assert `x`: each is the native program's decisive line, ahead of the abort it causes."""
    for quoted in ("`ctx != NULL'", "'__n < this->size()'", "‘top != 0’", "`idx < n`"):
        dec = _dec(
            f"loading\n/usr/include/c++/13/bits/stl_vector.h:1125: f(): Assertion {quoted} failed.\nAborted (core dumped)\n"
        )
        assert dec.line.endswith(f"Assertion {quoted} failed."), (quoted, dec.line)
        assert dec.rule == "native-assertion" and dec.category == "other" and dec.exception_type is None
    # GLib's warnings ("g_object_ref: assertion 'G_IS_OBJECT (object)' failed") are lowercase, CRITICAL-level
    # reports a program survives: they decide nothing here
    glib = analyze_text(
        "(app:1): GLib-GObject-CRITICAL **: g_object_ref: assertion 'G_IS_OBJECT (object)' failed\nready\n"
    )
    assert glib.decisive is None or glib.decisive.rule != "native-assertion"


def test_a_native_allocators_failed_allocation_is_decisive_over_the_loader_lines_relaying_it() -> None:
    """ggml prints no level: its backend's failed cudaMalloc (or host buffer) is the cause, the tensor-range,
    graph-allocator and model-load lines above the server's exit relay it."""
    for first, category in (
        (
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9220.57 MiB on device 0: cudaMalloc failed: out of memory",
            "oom",
        ),
        (
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 512.00 MiB on device 1: hipMalloc failed: out of memory",
            "oom",
        ),
        ("ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 437944320", "oom"),
    ):
        dec = _dec(
            "load_tensors: loading model tensors, this can take a while... (mmap = true)\n"
            f"{first}\n"
            "alloc_tensor_range: failed to allocate CUDA0 buffer of size 9668469760\n"
            "llama_model_load: error loading model: unable to allocate CUDA0 buffer\n"
            "llama_model_load_from_file_impl: failed to load model\n"
        )
        assert dec.line == first and dec.category == category and dec.rule == "allocator-oom"
    # a sentence about cudaMalloc is not an allocator's report
    assert analyze_text("note: cudaMalloc may fail when the GPU is shared\nready\n").verdict == "healthy"


def test_an_exception_whose_whole_message_is_a_native_record_stays_one_line_with_the_records_category() -> None:
    """``RuntimeError: [TensorRT-LLM][ERROR] …`` is not a bare ``RuntimeError:`` head over a record: it is one
    line, the exception's, and the record's words decide its category."""
    for check in (
        "mpiSize == tp * pp (worldConfig.cpp:99)",
        "MPI size 1 != TP size 2 * PP size 1 (worldConfig.cpp:98)",
    ):
        dec = _dec(
            "Traceback (most recent call last):\n"
            '  File "run.py", line 420, in main\n'
            "    runner = runner_cls.from_dir(**runner_kwargs)\n"
            f"RuntimeError: [TensorRT-LLM][ERROR] Assertion failed: {check}\n"
        )
        assert dec.line == f"RuntimeError: [TensorRT-LLM][ERROR] Assertion failed: {check}"
        assert dec.exception_type == "RuntimeError" and dec.category == "config" and dec.rule == "launch-layout"
    # a record inside a longer message is still a line of its own, and decisive over the message relaying it
    dec = _dec(
        "E0221 model_lifecycle.cc:654] failed to load 'm': [TensorRT-LLM][ERROR] Assertion failed: x != nullptr\n"
    )
    assert dec.line == "[TensorRT-LLM][ERROR] Assertion failed: x != nullptr" and dec.exception_type is None


def test_a_native_librarys_load_failure_and_a_runtimes_bare_strings_are_errors_at_no_level() -> None:
    """cuDNN's loader, HIP's error names and the CUDA runtime's strings printed bare by a native program are errors
    whatever their level (tests/corpus_extra's Whisper-WebUI #294, WhisperLiveKit #271, rocALUTION #197, hashcat
    #4133); the shell's report of the abort after them is not the cause."""
    for line, rule, category in (
        (
            "Could not load library libcudnn_cnn_infer.so.8. Error: libcudnn_cnn_infer.so.8: cannot open shared "
            "object file: No such file or directory",
            "library-load-failed",
            "import",
        ),
        (
            "Unable to load any of {libcudnn_ops.so.9.1.0, libcudnn_ops.so.9.1, libcudnn_ops.so.9}",
            "library-load-failed",
            "import",
        ),
        ("HIP error: invalid device function", "cuda-error", "cuda"),
        ("rocBLAS error from hip error code: 'hipErrorInvalidImage':200", "native-cuda-error", "cuda"),
        ("cuInit(): no CUDA-capable device is detected", "no-gpu-visible", "config"),
    ):
        dec = _dec(f"starting the model\n{line}\nAborted (core dumped)\n")
        assert (dec.line, dec.rule, dec.category) == (line, rule, category)


def test_a_runtimes_no_device_line_then_serving_on_the_cpu_is_healthy_and_idle_is_not() -> None:
    """A server that could not initialise CUDA and went on answering requests on the CPU did not fail: the error
    survived. One that came up on the CPU and answered nothing yet is a GPU node that sees no GPU: the line stands."""
    head = (
        "ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n"
        "load_tensors: CPU model buffer size = 4685.30 MiB\n"
        "main: server is listening on http://127.0.0.1:8080 - starting the main loop\n"
    )
    served = analyze_text(
        head + "slot launch_slot_: id  0 | task 0 | processing task\nslot print_timing: id  0 | task 0 | \n"
    )
    assert served.verdict == "healthy", served.summary
    idle = analyze_text(head + "srv  update_slots: all slots are idle\n")
    assert idle.verdict == "failed" and idle.decisive is not None and idle.decisive.rule == "no-gpu-visible"
