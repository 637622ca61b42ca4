"""The pure rules behind a kernel fault that stands alone: which events qualify, which history still counts,
what nvidia-smi adds, and the line shapes they are read from. (End to end: test_kernel_corpus_probe.py.)"""

from __future__ import annotations

import pytest

from fleetdiag.analysis import load_rules
from fleetdiag.evidence.correlate import current, standalone
from fleetdiag.evidence.gpu_health import parse_health
from fleetdiag.evidence.host import app_error
from fleetdiag.evidence.kernel import Clock, parse_kernel_lines, split_time
from fleetdiag.probe import finish
from fleetdiag.records import Decisive

from .test_kernel_probe import GPUS, NOW, _boot, _fr, _kernel_records


def _alone(lines: list[str], health: list[str] | None = None) -> str | None:
    got = standalone(parse_kernel_lines(lines, Clock(now=NOW, uptime=100000.5)), parse_health(health or []))
    return got.line if got else None


@pytest.mark.parametrize(
    ("lines", "chosen"),
    [
        # the driver's own consequence of an application fault on the same GPU is not a fault of its own
        (
            [
                "[10.0] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception",
                "[15.0] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, CTX SWITCH TIMEOUT",
            ],
            None,
        ),
        # ... but the same Xid 109 on another GPU is
        (
            [
                "[10.0] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception",
                "[15.0] NVRM: Xid (PCI:0000:18:00): 109, pid=1797828, name=pt_main_thread, CTX SWITCH TIMEOUT",
            ],
            "(PCI:0000:18:00): 109",
        ),
        (["[5.0] NVRM: Xid (PCI:0000:61:00): 45, pid=1, name=python3, Ch 0000000a"], None),  # cleanup alone
        (["[5.0] NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=python3, Ch 00000001 caused by previous Xid 149"], "149"),
        (
            ["[5.0] NVRM: Xid (PCI:0000:55:00): 63, pid=2, name=python, Row Remapper: New row marked for remapping"],
            None,
        ),
        (["[5.0] NVRM: Xid (PCI:0000:55:00): 154, GPU recovery action changed from 0x0 (None) to 0x0 (None)"], None),
        (
            [
                "[5.0] NVRM: Xid (PCI:0000:55:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
            ],
            "154",
        ),
        (
            ["[5.0] pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Transmitter ID)"],
            None,
        ),
        # a fatal AER on a port nothing ties to a GPU (a NIC's, a disk's) is not a GPU fault
        (["[5.0] pcieport 0000:00:01.1: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer"], None),
        (
            ["[5.0] nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer"],
            "nvidia 0000:3b",
        ),
        (
            [  # Non-Fatal is recovered unless the kernel says it could not recover (then the GPU's Xid decides)
                "[5.0] pcieport 0000:00:01.2: AER: Uncorrectable (Non-Fatal) error received from 0000:63:00.0",
                "[5.0] snd_hda_intel 0000:63:00.1: PCIe Bus Error: Uncorrectable (Non-Fatal), type=Transaction Layer",
                "[5.1] nvidia 0000:63:00.0: AER: can't recover (no error_detected callback)",
            ],
            None,
        ),
        (["[9.0] INFO: task cache_mgr_event:620917 blocked for more than 120 seconds."], None),
        (["[9.0] Out of memory: Killed process 4242 (python) total-vm:9kB, anon-rss:8kB"], None),
        (["[9.0] llama-server[80906]: segfault at 204803fe0 ip 00007f00399189d7 sp 00007ffc4a6104f0 error 4"], None),
        (["[9.0] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up"], "SXid"),
        (["[9.0] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Non-fatal, Link 63 LTSSM Fault Up"], None),
    ],
)
def test_which_faults_stand_alone(lines: list[str], chosen: str | None) -> None:
    got = _alone(lines)
    assert (got is None) if chosen is None else (got is not None and chosen in got), got


def test_xid_154_takes_the_class_of_the_recovery_it_asks_for() -> None:
    """A reset or a reboot is the driver's remedy, a drain is hardware's; the GSP lines before it are its cause,
    and a fault Xid 154 follows on its own GPU stays the decisive line."""
    ask = "[6.0] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to {}"

    def decision(lines: list[str]):  # noqa: ANN202
        return standalone(parse_kernel_lines(lines, Clock(now=NOW, uptime=100000.5)), [])

    gsp = "[5.0] NVRM: _kgspRpcRecvPoll: GSP RM heartbeat timed out"
    got = decision([gsp, ask.format("0x1 (GPU Reset Required)")])
    assert got is not None and "154" in got.line and got.category == "driver", got
    assert "heartbeat timed out" in got.why and "GPU Reset Required" in got.hint
    got = decision([ask.format("0x2 (Node Reboot Required)")])
    assert got is not None and got.category == "driver" and "after:" not in got.why
    got = decision([ask.format("0x3 (Drain and Reset)")])
    assert got is not None and got.category == "hardware"
    fell = "[5.0] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    got = decision([fell, ask.format("0x2 (Node Reboot Required)")])
    assert got is not None and ": 79," in got.line and got.category == "hardware"
    assert got.hint.startswith("the driver asks for: Node Reboot Required; ")


def test_history_ends_at_a_boot_or_a_driver_load() -> None:
    fault = "[50.0] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert _alone([fault]) is not None
    assert _alone([fault, "[9000.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07"]) is None
    # a fault seconds before the load is that load's own probe failing: it counts
    assert _alone([fault, "[60.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07"]) is not None
    assert _alone(["[1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07", fault]) is not None
    journal = [
        "Aug 10 15:36:05 n kernel: NVRM: Xid (PCI:0000:55:00): 48, An uncorrectable double bit error (DBE)",
        "Aug 10 16:00:00 n kernel: Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075) #45-Ubuntu SMP",
    ]
    evs = parse_kernel_lines(journal)
    assert [e.marker for e in evs] == [None, "boot"] and current(evs) == []


def test_nvidia_smi_refines_and_its_absence_clears_nothing() -> None:
    fell = f"{_boot(NOW - 600)} NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    log = ["serving 200 OK"]

    def reason(health: list[str] | None) -> tuple[str, str, float]:
        res = finish("n", _fr(log, _kernel_records([fell], health), idle=2), load_rules(), facts={})
        return res.verdict, res.decisive.reason, res.decisive.confidence

    verdict, why, conf = reason(None)  # the probe found no nvidia-smi section: nothing known of it
    assert verdict == "degraded" and "nvidia-smi is not installed" in why and conf == 0.8
    lost = [*GPUS[:1], "Unable to determine the device handle for GPU 0000:19:00.0: Unknown Error"]
    verdict, why, conf = reason(lost)
    assert verdict == "degraded" and "nvidia-smi confirms: GPU 19:00: GPU lost" in why and conf == 0.95
    verdict, why, conf = reason([GPUS[0], GPUS[2]])  # the bus is gone from nvidia-smi's list
    assert verdict == "degraded" and "does not list the GPU at 19:00" in why and conf == 0.9
    verdict, why, conf = reason(GPUS)  # it answers for that GPU with no fault: reset since? still degraded
    assert verdict == "degraded" and "a reset may have cleared it" in why and conf == 0.6


def test_a_failed_job_takes_the_standing_fault_unless_its_error_is_its_own() -> None:
    fell = f"{_boot(NOW - 7200)} NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    cuda = ["RuntimeError: CUDA error: no CUDA-capable device is detected"]
    res = finish("n", _fr(cuda, _kernel_records([fell], GPUS)), load_rules(), facts={})
    assert res.verdict == "failed" and res.decisive.source == "kernel" and res.decisive.consequence == cuda[0]
    typo = ["ModuleNotFoundError: No module named 'transformerz'"]
    res = finish("n", _fr(typo, _kernel_records([fell], GPUS)), load_rules(), facts={})
    assert res.verdict == "failed" and res.decisive.source == "log"
    assert any("unrecovered GPU fault" in m and "fallen off the bus" in m for m in res.markers)


@pytest.mark.parametrize(
    ("line", "pid", "name"),
    [
        (
            "/workspace/start.sh: line 15:   341 Segmentation fault      (core dumped) /opt/tritonserver/bin/tritonserver --x",
            341,
            "tritonserver",
        ),
        ("[1]    2111498 segmentation fault (core dumped)  tritonserver --help", 2111498, "tritonserver"),
        (
            "./run.sh: line 3: 80798 Aborted                 (core dumped) ./llama-server -m m.gguf",
            80798,
            "llama-server",
        ),
    ],
)
def test_the_shell_names_the_native_program_that_died(line: str, pid: int, name: str) -> None:
    a = app_error(Decisive(line=line, message=line), {}, None)
    assert (a.pid, a.process) == (pid, name)


def test_more_kernel_line_forms() -> None:
    clock = Clock(now=1_700_000_000.0, uptime=1000.0, tz_offset=0, year=2024)
    assert split_time("Aug 30 11:43:09.250000 red kernel: NVRM: x", clock, {}) == (1725018189.25, "NVRM: x")
    assert split_time("Fri 2024-08-30 11:43:09 UTC red kernel: NVRM: x", clock, {}) == (1725018189.0, "NVRM: x")
    assert split_time("Fri 2024-08-30 13:43:09 +0200 red kernel: NVRM: x", clock, {})[0] == 1725018189.0
    assert split_time("[  500.250000] red kernel: NVRM: x", clock, {}) == (1_699_999_500.25, "NVRM: x")
    (lost, load) = parse_kernel_lines(
        [
            "Oct 25 10:00:00 n kernel: NVRM: The NVIDIA GPU 0000:b3:00.0",
            "Oct 25 10:00:00 n kernel: NVRM: (PCI ID: 10de:26b5) installed in this system has",
            "Oct 25 10:00:00 n kernel: NVRM: fallen off the bus and is not responding to commands.",
            "Oct 25 10:00:00 n kernel: NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01",
        ],
        clock,
    )
    assert lost.kind == "gpu-lost" and lost.bus == "b3:00" and lost.line.endswith("not responding to commands.")
    assert load.marker == "driver-load"
    (a, b, c) = parse_kernel_lines(
        [
            "[1.0] pcieport 0000:00:01.2: AER: Uncorrectable (Non-Fatal) error received from 0000:63:00.0",
            "[1.1] nvidia 0000:63:00.0: AER: can't recover (no error_detected callback)",
            "[1.2] pcieport 0000:00:03.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer",
        ]
    )
    assert (a.kind, a.bus, a.severity) == ("pcie-aer-detail", "63:00", "uncorrected")
    assert (b.kind, b.driver, b.bus) == ("pcie-recovery", "nvidia", "63:00")
    assert (c.kind, c.driver, c.severity) == ("pcie-aer", "pcieport", "uncorrectable (fatal)")


def test_a_standing_fault_is_one_incident_by_its_line(tmp_path) -> None:
    from fleetdiag.store import incident_key

    fell = f"{_boot(NOW - 600)} NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    other = (
        f"{_boot(NOW - 600)} NVRM: Xid (PCI:0000:19:00): 48, An uncorrectable double bit error (DBE) has been detected"
    )
    keys = [
        incident_key(finish(h, _fr(["serving 200 OK"], _kernel_records([k], None), idle=2), load_rules(), facts={}))
        for h, k in (("a", fell), ("b", fell), ("c", other))
    ]
    assert keys[0] == keys[1] and keys[0] != keys[2] and keys[0].startswith("degraded:")


def test_the_ranks_pid_and_the_programs_name_come_from_the_log() -> None:
    d = Decisive(line="[rank1]: RuntimeError: CUDA error: an illegal memory access", message="x", process="rank1")
    own = ["2026-12-01 09:32:43,131 INFO [rank1] train: rank 1/3 local_rank 0 node_rank 1 pid 659 master x:1"]
    assert app_error(d, {}, None, own).pid == 659
    summary = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 1 (local_rank: 0)",
        "  exitcode  : -6 (pid: 2136)",
    ]
    assert app_error(d, {}, None, summary).pid == 2136
    launcher = "failed (exitcode: -9) local_rank: 0 (pid: 666) of binary: /opt/torch/.venv/bin/python"
    assert app_error(Decisive(line=launcher, message=launcher), {}, None).pid == 666
    native = [
        "[2026-12-01 09:32:36] start: /tmp/rec2/native/illegal_address_32g",
        "CUDA error at illegal_address_32g.cu:26",
    ]
    a = app_error(Decisive(line=native[1], message=native[1]), {}, None, native)
    assert "illegal_address_32g" in a.names


def test_a_program_named_in_the_log_links_but_a_generic_comm_does_not() -> None:
    from fleetdiag.evidence.correlate import AppError, decide

    evs = parse_kernel_lines(
        [
            "[49.0] NVRM: Xid (PCI:0000:00:06): 43, pid=1, name=python, channel 0x0000000a",
            "[49.1] NVRM: Xid (PCI:0000:00:06): 43, pid=2, name=device_assert, channel 0x0000000a",
        ]
    )
    app = AppError(
        line="CUDA error at device_assert.cu:28 code=710(cudaErrorAssert)", names=frozenset({"device_assert"})
    )
    got = decide(app, evs)
    assert got is not None and "name=device_assert" in got.line and "named in the log" in got.why
    generic = AppError(line="RuntimeError: CUDA error", names=frozenset({"python"}))
    assert decide(generic, evs[:1]) is None  # an unlinked application Xid with no time: not this error's


def test_an_oom_episode_is_named_by_its_killed_process_line() -> None:
    from fleetdiag.evidence.correlate import AppError, decide

    evs = parse_kernel_lines(
        [
            "[44.391812] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
            "[44.391990] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task_memcg=/n2,task=python,pid=666,uid=0",
            "[44.392003] Memory cgroup out of memory: Killed process 666 (python) total-vm:1kB, anon-rss:1kB",
        ]
    )
    got = decide(AppError(line="failed (exitcode: -9) local_rank: 0 (pid: 666)", pid=666), evs)
    assert got is not None and "Memory cgroup out of memory: Killed process 666" in got.line


def test_the_launchers_one_failed_child_is_the_failing_process() -> None:
    line = "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: Assertion failed."
    one = [
        "E1201 09:25:30.625000 1748 torch/distributed/elastic/multiprocessing/api.py:986] failed (exitcode: -6) "
        "local_rank: 0 (pid: 2136) of binary: /opt/torch/.venv/bin/python",
        "  exitcode  : -6 (pid: 2136)",
    ]
    assert app_error(Decisive(line=line, message=line), {}, None, one).pid == 2136
    two = [*one, "  exitcode  : -9 (pid: 2140)"]
    assert app_error(Decisive(line=line, message=line), {}, None, two).pid is None
