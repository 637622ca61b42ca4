"""Categories decided by a traceback's frames, NCCL's transport lines, and host tags of any form.

The real logs behind each class are corpus cases (tests/corpus_extra, through the CLI over sshd in
test_corpus_e2e.py); these pin the boundaries the conventions draw, on the pure analyzer.
"""

from __future__ import annotations

import pytest

from fleetdiag.analysis import analyze_text
from fleetdiag.analysis.frames import crosses_packages

SITE = "/usr/lib/python3.10/site-packages"


def _tb(frames: list[str], last: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path in frames:
        lines += [f'  File "{path}", line 10, in f', "    x = y.z"]
    return "\n".join(lines + [last]) + "\n"


@pytest.mark.parametrize(
    ("message", "paths", "crosses"),
    [
        # a module another package owns, imported or read from outside its tree
        ("cannot import name 'a' from 'transformers.utils' (x)", [f"{SITE}/vllm/config.py"], True),
        ("module 'numpy' has no attribute 'float'", [f"{SITE}/mmcv/ops.py"], True),
        ("cannot import name 'a' from 'sglang.utils' (x)", ["/src/LLaMA-Factory/src/llamafactory/chat/e.py"], True),
        # inside that package's own tree (installed or a checkout), or a circular import
        ("module 'sglang.srt.x' has no attribute 'g'", [f"{SITE}/sglang/srt/layers/q.py"], False),
        ("cannot import name 'a' from 'vllm.utils' (x)", ["/opt/vllm-source/vllm/v1/worker.py"], False),
        (
            "cannot import name 'a' from partially initialized module 'm' (most likely due to a circular import)",
            [f"{SITE}/m/a.py"],
            False,
        ),
        # an object's attribute across a package boundary, one side installed
        (
            "'LLMEngine' object has no attribute 'model_executor'",
            [f"{SITE}/openrlhf/e.py", f"{SITE}/vllm/llm.py"],
            True,
        ),
        ("'LlamaConfig' object has no attribute 'a'", ["/x/KIVI/models/k.py", f"{SITE}/transformers/c.py"], True),
        # one package calling itself, a project's own files, builtins and None, a single frame
        ("'Worker' object has no attribute 'm'", [f"{SITE}/vllm/a.py", f"{SITE}/vllm/b.py"], False),
        ("'Foo' object has no attribute 'm'", ["/home/u/proj/a.py", "/home/u/proj/b.py"], False),
        ("'NoneType' object has no attribute 'shape'", ["/home/u/train.py", f"{SITE}/torch/nn/m.py"], False),
        ("'list' object has no attribute 'to'", ["/home/u/train.py", f"{SITE}/transformers/t.py"], False),
        ("'Worker' object has no attribute 'model'", ["/data/RETA-LLM/index.py"], False),
        ("", [], False),
    ],
)
def test_crosses_packages(message: str, paths: list[str], crosses: bool) -> None:
    assert crosses_packages(message, paths) is crosses


def test_frames_decide_the_category_through_the_analyzer() -> None:
    """The same message is config across packages and python inside one; a queued CUDA call is cuda."""
    across = _tb(
        ["/x/proj/load.py", f"{SITE}/transformers/configuration_utils.py"],
        "AttributeError: 'LlavaConfig' object has no attribute 'X'",
    )
    inside = _tb(
        [f"{SITE}/transformers/a.py", f"{SITE}/transformers/configuration_utils.py"],
        "AttributeError: 'LlavaConfig' object has no attribute 'X'",
    )
    assert analyze_text(across).decisive.category == "config"
    assert analyze_text(inside).decisive.category == "python"
    lazy = (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/torch/cuda/__init__.py", line 306, in _lazy_init\n'
        "    queued_call()\n"
        f'  File "{SITE}/torch/cuda/__init__.py", line 174, in _check_capability\n'
        "    capability = get_device_capability(d)\n"
        'RuntimeError: device >= 0 && device < num_gpus INTERNAL ASSERT FAILED at "x.cpp":50\n'
    )
    init = (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/torch/cuda/__init__.py", line 314, in _lazy_init\n'
        "    torch._C._cuda_init()\n"
        "RuntimeError: No CUDA GPUs are available\n"
    )
    assert analyze_text(lazy).decisive.category == "cuda"
    assert analyze_text(init).decisive.category == "config"  # CUDA's own init, not a queued call


ROWS = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
    "  1073741824     268435456     float     sum      -1    19355   55.48  110.84      0    19189   55.96  111.80      0\n"
    "  2147483648     536870912     float     sum      -1    20218  106.22  212.23      0    19883  108.01  215.80      0\n"
)


@pytest.mark.parametrize(
    "tag", ["HCA-128: ", "gpu-node-07: ", "ip-10-0-3-7: ", "node07.cluster.local: ", "Meowth: ", "[1,3]<stdout>:"]
)
def test_a_host_tag_of_any_form_starts_a_line_after_result_rows(tag: str) -> None:
    fail = "Test NCCL failure common.cu:1204 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '"
    text = ROWS + tag + fail + "\n" + tag + fail + "\n"
    d = analyze_text(text).decisive
    assert d is not None and d.line.startswith(tag) and "Test NCCL failure" in d.line
    assert d.category == "cuda"


def test_an_nccl_transport_warn_beats_what_relays_it() -> None:
    """NCCL's transport line is nccl and decisive over the proxy's retcode and the test's check macro."""
    text = (
        "h:1:2 [1] misc/socket.cc:518 NCCL WARN Net : Call to recv from 10.0.0.2<5> failed : Broken pipe\n"
        "h:1:2 [1] NCCL INFO misc/socket.cc:535 -> 6\n"
        "h:1:2 [1] proxy.cc:1119 NCCL WARN [Proxy Service 9] Failed to execute operation Connect from rank 9, retcode 6\n"
        "h: Test NCCL failure common.cu:921 'remote process exited or there was a network error'\n"
    )
    d = analyze_text(text).decisive
    assert "Call to recv" in d.line and d.category == "nccl"
    refused = "h:1:2 [0] include/socket.h:390 NCCL WARN Connect to 10.0.0.2<21724> failed : Connection refused\n"
    assert analyze_text(refused).decisive.category == "network"  # reachability, not a connection it had
