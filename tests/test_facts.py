"""Host facts: nvidia-smi parsing (real fixtures), launch parsing, fact-aware hints, and the probe's facts over real SSH."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleetdiag import facts as F
from fleetdiag.analysis import load_rules
from fleetdiag.inventory import parse_inventory
from fleetdiag.probe import ProbeSettings, finish, probe_host, spec_for
from fleetdiag.records import FAILED
from fleetdiag.remote import funnel

SMI = Path(__file__).resolve().parent / "fixtures" / "nvidia-smi"  # copy of ../shared/fixtures/nvidia-smi
DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo"
SEED = (DEMO / "dp_rank.log").read_text()
SEED_HINT = "TP 2 × DP 2 = 4 workers, but CUDA_VISIBLE_DEVICES=0,1 exposes 2 GPUs"


def fake_nvidia_smi(bindir: Path, query: str = "nvidia-smi-query.csv", apps: str | None = None) -> Path:
    """A ``nvidia-smi`` that prints the real fixture for the query it is asked (and logs its arguments)."""
    bindir.mkdir(parents=True, exist_ok=True)
    q = shlex.quote
    apps_cmd = f"cat {q(str(SMI / apps))}" if apps else ":"
    script = f"""#!/bin/sh
printf '%s\\n' "$*" >> {q(str(bindir / "calls.txt"))}
case "$*" in
  *--query-gpu=*) cat {q(str(SMI / query))} ;;
  *--query-compute-apps=*) {apps_cmd} ;;
  -L*) cat {q(str(SMI / "nvidia-smi-L.txt"))} ;;
  *) cat {q(str(SMI / "nvidia-smi.txt"))} ;;
esac
"""
    exe = bindir / "nvidia-smi"
    exe.write_text(script)
    exe.chmod(0o755)
    return bindir


# ---------------------------------------------------------------- nvidia-smi parsers on the real outputs


def test_query_csv_fixture_idle_and_busy():
    idle = F.parse_gpu_csv((SMI / "nvidia-smi-query.csv").read_text())
    assert [(g.index, g.name, g.memory_used_mib, g.memory_total_mib, g.utilization_pct) for g in idle] == [
        (0, "NVIDIA H200", 0, 143771, 0),
        (1, "NVIDIA H200", 0, 143771, 0),
    ]
    assert idle[1].uuid == "GPU-bf536ef9-0bde-e86f-74b2-9b4206bc7b79"
    busy = F.parse_gpu_csv((SMI / "nvidia-smi-query-busy.csv").read_text())
    assert [g.memory_used_mib for g in busy] == [4, 19601]
    assert busy[1].free_mib == 143771 - 19601


def test_compute_apps_fixture_joins_its_gpu_by_uuid():
    gpus = F.parse_gpu_csv((SMI / "nvidia-smi-query-busy.csv").read_text())
    apps = F.parse_apps_csv((SMI / "nvidia-smi-apps.csv").read_text())
    assert [(a.pid, a.name, a.used_mib) for a in apps] == [(561, "python3", 19592)]
    F.attach_processes(gpus, apps, {561: "python3 train.py"})
    assert gpus[0].processes == []
    assert gpus[1].processes[0].pid == 561 and gpus[1].processes[0].cmdline == "python3 train.py"
    assert gpus[1].to_dict()["processes"] == [
        {"pid": 561, "name": "python3", "used_mib": 19592, "cmdline": "python3 train.py"}
    ]


def test_list_fixture():
    gpus = F.parse_smi_list((SMI / "nvidia-smi-L.txt").read_text())
    assert [(g.index, g.name, g.uuid) for g in gpus] == [
        (0, "NVIDIA H200", "GPU-08ec45a2-2659-8934-e427-3905e4e7873b"),
        (1, "NVIDIA H200", "GPU-bf536ef9-0bde-e86f-74b2-9b4206bc7b79"),
    ]


def test_default_table_fixture():
    gpus = F.parse_smi_table((SMI / "nvidia-smi.txt").read_text())
    assert [(g.index, g.name, g.memory_used_mib, g.memory_total_mib, g.utilization_pct, g.processes) for g in gpus] == [
        (0, "NVIDIA H200", 0, 143771, 0, []),
        (1, "NVIDIA H200", 0, 143771, 0, []),
    ]


def test_default_table_processes_section():
    text = (
        (SMI / "nvidia-smi.txt")
        .read_text()
        .replace(
            "|  No running processes found                                                             |",
            "|    1   N/A  N/A             561      C   python3                                19592MiB |",
        )
    )
    gpus = F.parse_smi_table(text)
    assert gpus[0].processes == []
    assert [(p.pid, p.name, p.used_mib) for p in gpus[1].processes] == [(561, "python3", 19592)]


def test_csv_with_header_and_units():
    text = (
        "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
        "0, GPU-08ec45a2-2659-8934-e427-3905e4e7873b, NVIDIA H200, 4 MiB, 143771 MiB, 7 %\n"
        "1, GPU-bf536ef9-0bde-e86f-74b2-9b4206bc7b79, NVIDIA H200, 19601 MiB, 143771 MiB, [N/A]\n"
    )
    gpus = F.parse_gpu_csv(text)
    assert [(g.index, g.memory_used_mib, g.memory_total_mib, g.utilization_pct) for g in gpus] == [
        (0, 4, 143771, 7),
        (1, 19601, 143771, None),
    ]
    apps = F.parse_apps_csv(
        "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n"
        "561, python3, 19592 MiB, GPU-bf536ef9-0bde-e86f-74b2-9b4206bc7b79\n"
    )
    assert (apps[0].pid, apps[0].used_mib, apps[0].gpu_uuid) == (561, 19592, "GPU-bf536ef9-0bde-e86f-74b2-9b4206bc7b79")


# Text a broken or hostile nvidia-smi (or a wrapper in front of it) could print: under the old
# parser every line starting with a number became a GPU.
GARBAGE = [
    "14 Aug 2026 10:00:01 GPU driver banner",
    "15, 16, 17",
    "16, GPU-zz!, NVIDIA H200, 0, 143771, 0",  # UUID of the wrong shape
    "17, GPU-08ec45a2, NVIDIA H200, lots, 143771, 0",  # memory not a number
    "18, GPU-08ec45a2, NVIDIA H200, 200000, 143771, 0",  # more used than there is
    "19, GPU-08ec45a2, NVIDIA H200, 0, 143771, 250",  # utilisation over 100 %
    "20, GPU-08ec45a2, NVIDIA H200",  # fields missing
    "4096, GPU-08ec45a2, NVIDIA H200, 0, 143771, 0",  # no host has GPU 4096
    "-1, GPU-08ec45a2, NVIDIA H200, 0, 143771, 0",
    "3.5, GPU-08ec45a2, NVIDIA H200, 0, 143771, 0",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    "\x00\x1b[31m7, \x7f\x80, , , ,",
]


def test_garbage_nvidia_smi_output_invents_no_gpus():
    gpus, rejected = F.read_gpu_csv("\n".join(GARBAGE))
    assert gpus == [] and len(rejected) == len(GARBAGE)
    assert F.parse_gpu_csv("\n".join(GARBAGE)) == []
    # a repeated index is one GPU at most, and the repeat is rejected
    row = "0, GPU-08ec45a2-2659-8934-e427-3905e4e7873b, NVIDIA H200, 0, 143771, 0"
    gpus, rejected = F.read_gpu_csv(row + "\n" + row)
    assert [g.index for g in gpus] == [0] and rejected == [row]
    # N/A fields are an answer, not garbage
    gpus, rejected = F.read_gpu_csv("0, [N/A], NVIDIA H200, [N/A], [N/A], [Not Supported]")
    assert rejected == [] and (gpus[0].uuid, gpus[0].memory_total_mib, gpus[0].utilization_pct) == (None, None, None)


def test_garbage_from_random_lines_never_counts_as_gpus():
    import random

    rnd = random.Random(17)
    alphabet = "0123456789, -.abcdefGPU[]/%MiB\t\x00é"
    lines = [
        str(rnd.randrange(40)) + ", " + "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(60)))
        for _ in range(500)
    ]
    gpus, rejected = F.read_gpu_csv("\n".join(lines))
    assert gpus == [] and len(rejected) == len(lines)


def test_garbage_output_is_a_failed_nvidia_smi_not_gpus():
    good = (SMI / "nvidia-smi-query.csv").read_text().splitlines()
    facts = F.build({"nvidia_smi": ["/usr/bin/nvidia-smi"], "gpu": GARBAGE})
    assert facts["nvidia_smi"].startswith("failed: output not understood (12 lines not a GPU row): 14 Aug")
    assert facts["gpus"] == []
    mixed = F.build({"nvidia_smi": ["/usr/bin/nvidia-smi"], "gpu": good + GARBAGE[:3]})
    assert mixed["nvidia_smi"].startswith("failed: output not understood (3 lines")
    assert [g["index"] for g in mixed["gpus"]] == [0, 1]  # the real rows are kept, nothing is invented
    assert F.summary_lines(facts)[0] == ("gpus", "nvidia-smi " + facts["nvidia_smi"])


def test_preflight_does_not_pass_on_garbage_nvidia_smi_output():
    from fleetdiag import preflight as P

    launch = P.plan(["vllm", "serve", "m", "-tp", "2"])
    checks, _ = P.evaluate(launch, {"nvidia_smi": ["/usr/bin/nvidia-smi"], "gpu": GARBAGE}, None)
    by = {c.name: c for c in checks}
    assert by["nvidia-smi"].status == P.FAIL and "output not understood" in by["nvidia-smi"].detail
    assert all(c.status != P.PASS for c in checks if c.name in ("nvidia-smi", "gpu-count", "gpus-free"))
    ok, _ = P.evaluate(
        launch,
        {"nvidia_smi": ["/usr/bin/nvidia-smi"], "gpu": (SMI / "nvidia-smi-query.csv").read_text().splitlines()},
        None,
    )
    assert {c.name: c for c in ok}["nvidia-smi"].status == P.PASS


def test_smi_list_and_table_skip_repeats_and_odd_indices():
    text = (SMI / "nvidia-smi-L.txt").read_text()
    assert len(F.parse_smi_list(text + text + "GPU 99: X (UUID: GPU-1)\nGPU 2: X (UUID: garbage)\n")) == 2


def test_build_from_snippet_records():
    raw = {
        "nvidia_smi": ["/usr/bin/nvidia-smi"],
        "gpu": (SMI / "nvidia-smi-query-busy.csv").read_text().splitlines(),
        "app": (SMI / "nvidia-smi-apps.csv").read_text().splitlines(),
        "app_cmd": ["561\tpython3 -m sglang.launch_server"],
        "serve_pid": ["7001"],
        "serve_cmd": ["/venv/bin/python3\t/venv/bin/vllm\tserve\tQwen/Qwen3.6-27B\t-tp\t2\t"],
        "serve_candidates": ["1"],
        "serve_environ": ["readable"],
        "serve_cvd": ["0,1"],
    }
    facts = F.build(raw)
    assert facts["nvidia_smi"] == "ok"
    assert facts["gpus"][1]["processes"][0]["cmdline"] == "python3 -m sglang.launch_server"
    assert facts["cuda_visible_devices"] == "0,1"
    assert facts["serving"]["launcher"] == "vllm" and facts["serving"]["pid"] == 7001
    assert facts["parallel"] == {"tp": 2, "dp": 1, "pp": 1}
    assert facts["parallel_source"] == "command line of pid 7001"
    json.dumps(facts)  # JSON-ready


def test_missing_or_broken_nvidia_smi_is_a_fact():
    assert F.build({"nvidia_smi": ["missing"]}) == {"nvidia_smi": "missing"}
    broken = F.build(
        {
            "nvidia_smi": ["/usr/bin/nvidia-smi"],
            "nvidia_smi_error": [
                "exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
            ],
        }
    )
    assert broken["nvidia_smi"].startswith("failed: exit 9: NVIDIA-SMI has failed")
    assert "gpus" not in broken


def test_untrusted_serving_process_does_not_lend_its_cvd():
    """Two vLLMs on the host and neither writes this log: its CUDA_VISIBLE_DEVICES is not this run's."""
    facts = F.build(
        {
            "serve_pid": ["9"],
            "serve_cmd": ["vllm\tserve\tm"],
            "serve_candidates": ["2"],
            "serve_environ": ["readable"],
            "serve_cvd": ["5"],
        }
    )
    assert "cuda_visible_devices" not in facts and facts["serving"]["pid"] == 9


# ---------------------------------------------------------------- parallelism from logs and commands


def test_non_default_args_from_the_seed_log():
    line = next(ln for ln in SEED.splitlines() if "non-default args" in ln)
    nda = F.parse_non_default_args(line)
    assert nda["tensor_parallel_size"] == 2 and nda["data_parallel_size"] == 2
    par, source, _ = F.parallel_from_log([line])
    assert par == {"tp": 2, "dp": 2, "pp": 1} and "non-default args" in source


def test_non_default_args_cut_short_still_read():
    line = (
        "(APIServer pid=1) INFO 05-09 15:14:05 [utils.py:328] non-default args: {'model': 'Q', "
        "'tensor_parallel_size': 4, 'pipeline_parallel_size': 2, 'kv_transfer_config': {'kv_conn...[fleetdiag: 9 bytes cut]"
    )
    par, _, _ = F.parallel_from_log([line])
    assert par == {"tp": 4, "dp": 1, "pp": 2}
    assert F.parse_non_default_args("non-default args: {__import__('os').system('x')}") == {}


def test_torchrun_and_sglang_and_deepspeed_lines():
    par, src, _ = F.parallel_from_log(["  nproc_per_node   : 8"])
    assert par == {"nproc_per_node": 8} and "torchrun" in src
    par, _, _ = F.parallel_from_log(
        ["[2025-01-01 10:00:00] server_args=ServerArgs(model_path='m', tp_size=4, dp_size=2, pp_size=1)"]
    )
    assert par == {"tp": 4, "dp": 2, "pp": 1}
    _, _, cvd = F.parallel_from_log(
        ["[2020-12-24 16:25:13,902] [INFO] [launch.py:102:main] Setting CUDA_VISIBLE_DEVICES=0,1"]
    )
    assert cvd == "0,1"


@pytest.mark.parametrize(
    "cmd, launcher, env, model, workers, arith",
    [
        (
            "CUDA_VISIBLE_DEVICES=0,1 vllm serve Qwen/Qwen3.6-27B -tp 2 -dp 2",
            "vllm",
            {"CUDA_VISIBLE_DEVICES": "0,1"},
            "Qwen/Qwen3.6-27B",
            4,
            "TP 2 × DP 2 = 4 workers",
        ),
        (
            "vllm serve /models/q --tensor-parallel-size=2 --pipeline-parallel-size 2",
            "vllm",
            {},
            "/models/q",
            4,
            "TP 2 × PP 2 × DP 1 = 4 workers",
        ),
        (
            "vllm serve m -tp 4 -dp 4 --data-parallel-size-local 2",
            "vllm",
            {},
            "m",
            8,
            "TP 4 × DP-local 2 = 8 workers on this node (DP 4 in all)",
        ),
        (
            "python -m vllm.entrypoints.openai.api_server --model m --tensor_parallel_size 8",
            "vllm",
            {},
            "m",
            8,
            "TP 8 × DP 1 = 8 workers",
        ),
        (
            "nohup env CUDA_VISIBLE_DEVICES=4,5 torchrun --nproc-per-node=2 --nnodes 1 train.py --tp 8",
            "torchrun",
            {"CUDA_VISIBLE_DEVICES": "4,5"},
            None,
            2,
            "nproc_per_node 2 = 2 workers",
        ),
        (
            "python3 -m torch.distributed.run --nproc_per_node 4 -m pkg.train",
            "torchrun",
            {},
            None,
            4,
            "nproc_per_node 4 = 4 workers",
        ),
        (
            "python -m sglang.launch_server --model-path m --tp-size 2 --dp-size 2",
            "sglang",
            {},
            "m",
            4,
            "TP 2 × DP 2 = 4 workers",
        ),
        (
            "python -m sglang.launch_server --model-path m --tp 4 --dp 2 --enable-dp-attention",
            "sglang",
            {},
            "m",
            4,
            "TP 4 = 4 workers (DP 2 shares them: DP attention)",
        ),
        (
            "bash -c 'CUDA_VISIBLE_DEVICES=0 vllm serve m'",
            "vllm",
            {"CUDA_VISIBLE_DEVICES": "0"},
            "m",
            1,
            "TP 1 × DP 1 = 1 worker",
        ),
    ],
)
def test_parse_launch(cmd, launcher, env, model, workers, arith):
    launch = F.parse_launch(cmd)
    assert launch.launcher == launcher
    assert launch.env == env
    assert launch.model == model
    assert F.workers(launch.parallel(), launch.launcher, launch.dp_attention) == (workers, arith)


def test_parse_launch_env_option_wins_and_unknown_launcher():
    launch = F.parse_launch("CUDA_VISIBLE_DEVICES=0 vllm serve m", {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert launch.cuda_visible_devices == "0,1"
    assert F.parse_launch("python train.py").launcher is None
    nproc = F.parse_launch("torchrun --nproc_per_node gpu train.py")
    assert nproc.nproc_per_node is None and nproc.nproc_spec == "gpu"


def test_secrets_in_command_lines_are_masked():
    argv = ["HF_TOKEN=hf_abc", "vllm", "serve", "m", "--api-key", "sk-1", "--hf-token=hf_x", "-tp", "2"]
    assert F.redact_argv(argv) == [
        "HF_TOKEN=***",
        "vllm",
        "serve",
        "m",
        "--api-key",
        "***",
        "--hf-token=***",
        "-tp",
        "2",
    ]
    launch = F.parse_launch(argv, {"WANDB_API_KEY": "k", "CUDA_VISIBLE_DEVICES": "0"})
    d = launch.to_dict()
    assert "sk-1" not in json.dumps(d) and "hf_abc" not in json.dumps(d)
    assert d["env"]["CUDA_VISIBLE_DEVICES"] == "0" and d["env"]["WANDB_API_KEY"] == "***"
    facts = F.build(
        {
            "serve_pid": ["5"],
            "serve_cmd": ["vllm\tserve\tm\t--api-key\tsk-secret"],
            "serve_candidates": ["1"],
            "nvidia_smi": ["x"],
            "gpu": ["0, GPU-a, G, 1, 2, 0"],
            "app": ["5, python, 1, GPU-a"],
            "app_cmd": ["5\tpython -m vllm --api-key=sk-secret"],
        }
    )
    assert "sk-secret" not in json.dumps(facts)


def test_visibility_follows_cuda_rules():
    gpus = [g.to_dict() for g in F.parse_gpu_csv((SMI / "nvidia-smi-query.csv").read_text())]
    assert F.visibility("0,1", gpus).count == 2
    assert F.visibility("1", gpus).indices == [1]
    bad = F.visibility("0,3,1", gpus)  # CUDA stops at the first entry naming no device
    assert (bad.count, bad.invalid) == (1, ["3"])
    assert F.visibility("", gpus).count == 0
    assert F.visibility("GPU-bf536ef9", gpus).indices == [1]
    assert F.visibility(None, gpus).count == 2
    assert F.visibility("0,1,2,3", None).count == 4  # no GPU list: trust the entries


# ---------------------------------------------------------------- hints that use facts


@dataclass
class _Dec:
    message: str
    line: str = ""
    hint: str | None = "generic hint"
    category: str = "config"
    traceback: list[str] = field(default_factory=list)


GPUS = [g.to_dict() for g in F.parse_gpu_csv((SMI / "nvidia-smi-query.csv").read_text())]
BUSY = F.build(
    {
        "nvidia_smi": ["x"],
        "gpu": (SMI / "nvidia-smi-query-busy.csv").read_text().splitlines(),
        "app": (SMI / "nvidia-smi-apps.csv").read_text().splitlines(),
    }
)["gpus"]


def test_ordinal_hint_arithmetic_with_cvd():
    d = _Dec("AssertionError: DP adjusted local rank 3 is out of bounds")
    hint = F.refine_hint(d, {"gpus": GPUS, "cuda_visible_devices": "0,1", "parallel": {"tp": 2, "dp": 2, "pp": 1}})
    assert hint.startswith(SEED_HINT)
    assert "use DP 1 with TP 2" in hint


def test_ordinal_hint_suggests_gpus_to_expose_when_the_host_has_them():
    eight = [{"index": i, "processes": []} for i in range(8)]
    d = _Dec("torch.AcceleratorError: CUDA error: invalid device ordinal")
    hint = F.refine_hint(d, {"gpus": eight, "cuda_visible_devices": "0,1", "parallel": {"tp": 2, "dp": 2}})
    assert hint.startswith(SEED_HINT) and "CUDA_VISIBLE_DEVICES=0,1,2,3" in hint


def test_ordinal_hint_counts_pipeline_stages_and_torchrun():
    d = _Dec("RuntimeError: CUDA error: invalid device ordinal")
    hint = F.refine_hint(d, {"gpus": GPUS, "parallel": {"tp": 2, "pp": 2, "dp": 1}})
    assert hint.startswith("TP 2 × PP 2 × DP 1 = 4 workers, but the host has 2 GPUs")
    hint = F.refine_hint(d, {"gpus": GPUS, "parallel": {"nproc_per_node": 8}})
    assert hint.startswith("nproc_per_node 8 = 8 workers, but the host has 2 GPUs")


def test_ordinal_hint_without_parallel_uses_the_rank():
    d = _Dec("AssertionError: DP adjusted local rank 3 is out of bounds")
    hint = F.refine_hint(d, {"gpus": GPUS, "cuda_visible_devices": "0,1"})
    assert hint.startswith("local rank 3 needs at least 4 GPUs, but CUDA_VISIBLE_DEVICES=0,1 exposes 2 GPUs")


def test_ordinal_hint_without_gpu_facts_reasons_from_the_rank():
    d = _Dec("AssertionError: DP adjusted local rank 3 is out of bounds")
    hint = F.refine_hint(d, {"nvidia_smi": "missing", "parallel": {"tp": 2, "dp": 2, "pp": 1}})
    assert hint.startswith("TP 2 × DP 2 = 4 workers, but local rank 3 had no GPU, so at most 3 were visible")


def test_ordinal_hint_keeps_the_rule_hint_when_facts_do_not_explain_it():
    d = _Dec("RuntimeError: CUDA error: invalid device ordinal")
    assert F.refine_hint(d, {"gpus": GPUS, "cuda_visible_devices": "0,1", "parallel": {"tp": 2, "dp": 1}}) is None


def test_refined_hint_does_not_depend_on_the_rule_hint_text():
    """No substring reconciliation: the same facts give the same refined hint whatever the rule said."""
    facts = {"gpus": GPUS, "cuda_visible_devices": "0,1", "parallel": {"tp": 2, "dp": 2}}
    said = _Dec("AssertionError: DP adjusted local rank 3 is out of bounds", hint=SEED_HINT + ": lower the sizes.")
    generic = _Dec("AssertionError: DP adjusted local rank 3 is out of bounds", hint="generic")
    assert F.refine_hint(said, facts) == F.refine_hint(generic, facts) == SEED_HINT + ": use DP 1 with TP 2"
    assert F.refine_hint(_Dec("ValueError: x"), {"gpus": GPUS}) is None


def test_oom_hint_memory_arithmetic():
    d = _Dec(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 372.50 GiB. GPU 1 has a total capacity "
        "of 139.81 GiB of which 138.00 GiB is free. Of the allocated memory 1.2 GiB is allocated by PyTorch",
        category="oom",
    )
    hint = F.refine_hint(d, {})
    assert hint.startswith("GPU 1: 138 GiB free of 139.8 GiB, asked 372.5 GiB; more than the whole GPU")
    old = _Dec(
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
        "14.56 GiB already allocated; 3.44 MiB free; 14.76 GiB reserved in total by PyTorch)",
        category="oom",
    )
    assert F.refine_hint(old, {}).startswith("GPU 0: 3 MiB free of 15.8 GiB, asked 20 MiB")


def test_oom_hint_names_the_process_holding_the_gpu():
    d = _Dec(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 1 has a total capacity "
        "of 139.81 GiB of which 12.00 GiB is free. Process 561 has 19.14 GiB memory in use.",
        category="oom",
    )
    hint = F.refine_hint(d, {"gpus": BUSY, "cuda_visible_devices": "0,1"})
    assert "GPU 1: 12 GiB free of 139.8 GiB, asked 20 GiB" in hint
    assert "process 561 holds 19.1 GiB" in hint
    assert "nvidia-smi now: GPU 1: pid 561" in hint


def test_card_shows_a_compact_facts_block():
    from io import StringIO

    from fleetdiag.records import HostResult
    from fleetdiag.render import Env, host_card

    facts = {"nvidia_smi": "ok", "gpus": BUSY, "cuda_visible_devices": "0,1", "parallel": {"tp": 2, "dp": 2, "pp": 1}}
    rows = F.summary_lines(facts)
    assert rows == [
        ("gpus", "2× NVIDIA H200 (140.4 GiB) · busy: 1 (19.1 GiB, pid 561 python3) · idle: 0"),
        ("launch", "CUDA_VISIBLE_DEVICES=0,1 · TP 2 × DP 2 = 4 workers"),
    ]
    buf = StringIO()
    env = Env(stdout=buf, color=False, width=140)
    env.out.print(host_card(HostResult(host="h", verdict="healthy", facts=facts)))
    text = buf.getvalue()
    assert "2× NVIDIA H200" in text and "CUDA_VISIBLE_DEVICES=0,1 · TP 2 × DP 2 = 4 workers" in text
    assert F.summary_lines({"nvidia_smi": "missing"}) == [("gpus", "nvidia-smi not found on PATH")]


# ---------------------------------------------------------------- the snippet itself (local sh, then real SSH)


def _run_funnel_locally(log: Path, path_prepend: str | None):
    rules = load_rules(user_default=False)
    spec = spec_for(str(log), rules)
    spec.extra += F.SNIPPET
    spec.extra_vars.update(F.snippet_vars(path_prepend))
    mark = funnel.new_mark()
    out = subprocess.run(
        ["sh", "-c", funnel.build_script(spec, mark)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )
    fr = funnel.parse_output(out.stdout.decode(), mark)
    return fr, finish("h", fr, rules, facts=F.build(fr.facts.get("raw"))), rules


def test_snippet_reads_fixtures_and_the_runs_parallel_settings(tmp_path):
    bindir = fake_nvidia_smi(tmp_path / "bin", "nvidia-smi-query-busy.csv", "nvidia-smi-apps.csv")
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    fr, res, _ = _run_funnel_locally(log, str(bindir))
    calls = (bindir / "calls.txt").read_text().splitlines()
    assert calls == [
        "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits",
        "--query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits",
    ]
    assert [g["memory_used_mib"] for g in res.facts["gpus"]] == [4, 19601]
    assert res.facts["gpus"][1]["processes"][0]["pid"] == 561
    assert res.facts["parallel"] == {"tp": 2, "dp": 2, "pp": 1}
    assert "non-default args" in fr.facts["raw"]["logline"][0]


def test_snippet_without_nvidia_smi(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    empty = tmp_path / "empty"
    empty.mkdir()
    env_path = os.environ.get("PATH", "")
    if any(Path(p, "nvidia-smi").exists() for p in env_path.split(os.pathsep)):
        pytest.skip("this machine has a real nvidia-smi")
    _, res, _ = _run_funnel_locally(log, str(empty))
    assert res.facts["nvidia_smi"] == "missing"
    assert res.verdict == FAILED


def _inventory(sshd, log: Path):
    text = (
        f"hosts:\n  uk-node:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {json.dumps(str(log))}\n"
    )
    return parse_inventory(text, "facts-inventory.yaml")


@pytest.fixture
def serving(tmp_path):
    """A stand-in for the seeds' ``vllm serve``: its command line, its CUDA_VISIBLE_DEVICES, stdout on the log."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    script = tmp_path / "venv" / "bin" / "vllm"
    script.parent.mkdir(parents=True)
    script.write_text("import time\ntime.sleep(120)\n")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(script),
                "serve",
                "Qwen/Qwen3.6-27B",
                "--tensor-parallel-size",
                "2",
                "--data-parallel-size",
                "2",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"},
        )
    try:
        yield log, proc
    finally:
        proc.kill()
        proc.wait(5)


def test_probe_hint_for_the_seed_shows_the_arithmetic(sshd, tmp_path, serving):
    """Through real sshd: GPUs from a fake nvidia-smi, CUDA_VISIBLE_DEVICES from the serving process, one round trip."""
    log, proc = serving
    bindir = fake_nvidia_smi(tmp_path / "bin")
    inv = _inventory(sshd, log)
    settings = ProbeSettings(transport=sshd.opts(), path_prepend=str(bindir))
    res = asyncio.run(probe_host(inv.hosts["uk-node"], settings))
    assert res.verdict == FAILED, res
    assert "DP adjusted local rank 3 is out of bounds" in res.decisive.line
    assert res.decisive.hint.startswith(SEED_HINT), res.decisive.hint
    assert res.timing.round_trips == 1
    facts = res.to_json()["facts"]
    assert [g["name"] for g in facts["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert facts["cuda_visible_devices"] == "0,1"
    assert facts["serving"]["pid"] == proc.pid and facts["serving"]["writes_log"] is True
    assert facts["serving"]["launcher"] == "vllm"
    assert facts["parallel"] == {"tp": 2, "dp": 2, "pp": 1}


def test_probe_cli_json_and_card_carry_facts(sshd, tmp_path, serving):
    from click.testing import CliRunner

    from fleetdiag.cli import main

    log, _ = serving
    bindir = fake_nvidia_smi(tmp_path / "bin", "nvidia-smi-query-busy.csv", "nvidia-smi-apps.csv")
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        f"hosts:\n  uk-node:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {log}\n"
    )
    ssh_args = [
        *sshd.cli_args(),
    ]
    ssh_args += ["--path-prepend", str(bindir)]
    result = CliRunner().invoke(main, ["-i", str(inv), "probe", "uk-node", "--json", *ssh_args])
    card = CliRunner().invoke(
        main, ["-i", str(inv), "--no-color", "probe", "uk-node", *ssh_args], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 1, result.output
    host = json.loads(result.output)["hosts"][0]
    assert host["facts"]["gpus"][1]["processes"][0]["pid"] == 561
    assert host["decisive"]["hint"].startswith(SEED_HINT)
    assert "2× NVIDIA H200 (140.4 GiB) · busy: 1 (19.1 GiB, pid 561 python3) · idle: 0" in card.output
    assert "CUDA_VISIBLE_DEVICES=0,1 · TP 2 × DP 2 = 4 workers" in card.output


def test_probe_without_nvidia_smi_still_diagnoses(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    inv = _inventory(sshd, log)
    res = asyncio.run(probe_host(inv.hosts["uk-node"], ProbeSettings(transport=sshd.opts(), path_prepend=str(empty))))
    assert res.verdict == FAILED
    if res.facts.get("nvidia_smi") != "ok":  # a GPU runner may have a real one
        assert res.facts["nvidia_smi"] == "missing"
    assert res.facts["parallel"] == {"tp": 2, "dp": 2, "pp": 1}
