"""``fleetdiag preflight``: the launch checked against the host's GPUs, pure checks and through real sshd."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag import preflight as P
from fleetdiag.cli import main
from fleetdiag.facts import parse_launch
from fleetdiag.inventory import parse_inventory
from fleetdiag.probe import ProbeSettings

from .conftest import inventory_file
from .sshd import free_port
from .test_facts import SMI, fake_nvidia_smi

SEED_FAIL = "TP 2 × DP 2 = 4 workers, but CUDA_VISIBLE_DEVICES=0,1 exposes 2 GPUs"
SEED_LAUNCH = ["vllm", "serve", "Qwen/Qwen3.6-27B", "-tp", "2", "-dp", "2"]
FIXED_LAUNCH = ["vllm", "serve", "Qwen/Qwen3.6-27B", "-tp", "2", "-dp", "1"]


def raw(query: str = "nvidia-smi-query.csv", apps: str | None = None, **extra: list[str]) -> dict[str, list[str]]:
    r = {
        "nvidia_smi": ["/usr/bin/nvidia-smi"],
        "gpu": (SMI / query).read_text().splitlines(),
        "app": (SMI / apps).read_text().splitlines() if apps else [],
    }
    r.update(extra)
    return r


def checks(cmd, env=None, records=None, expected=None) -> dict[str, P.Check]:
    launch = P.plan(cmd, env)
    out, _facts = P.evaluate(launch, records if records is not None else raw(), expected)
    return {c.name: c for c in out}


# ---------------------------------------------------------------- the checks, from fixtures


def test_seed_launch_fails_with_the_arithmetic():
    c = checks(SEED_LAUNCH, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert c["gpu-count"].status == P.FAIL
    assert c["gpu-count"].detail == SEED_FAIL
    assert c["gpu-ids"].status == P.PASS
    assert c["gpus-free"].status == P.PASS
    assert c["nvidia-smi"].status == P.PASS and "2× NVIDIA H200" in c["nvidia-smi"].detail


def test_fixed_launch_passes():
    c = checks(FIXED_LAUNCH, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert c["gpu-count"].status == P.PASS
    assert c["gpu-count"].detail == "TP 2 × DP 1 = 2 workers; CUDA_VISIBLE_DEVICES=0,1 exposes 2 GPUs"
    assert not [x for x in c.values() if x.status == P.FAIL]


def test_inline_env_prefix_and_login_environment():
    c = checks(["CUDA_VISIBLE_DEVICES=0,1", *SEED_LAUNCH])
    assert c["gpu-count"].detail == SEED_FAIL
    c = checks(SEED_LAUNCH, records=raw(login_cvd=["1"]))
    assert c["gpu-count"].status == P.FAIL
    assert "from the host's login environment" in c["gpu-ids"].detail
    c = checks(SEED_LAUNCH)  # nothing set: every GPU of the host
    assert c["gpu-count"].detail == "TP 2 × DP 2 = 4 workers, but the host has 2 GPUs"


def test_cvd_naming_a_missing_gpu_fails():
    c = checks(FIXED_LAUNCH, {"CUDA_VISIBLE_DEVICES": "1,2"})
    assert c["gpu-ids"].status == P.FAIL and "2: no such GPU on this host" in c["gpu-ids"].detail
    assert c["gpu-count"].status == P.FAIL and "exposes 1 GPU" in c["gpu-count"].detail


def test_empty_cvd_hides_every_gpu():
    c = checks(FIXED_LAUNCH, {"CUDA_VISIBLE_DEVICES": ""})
    assert c["gpu-ids"].status == P.WARN
    assert c["gpu-count"].status == P.FAIL
    assert c["gpu-count"].detail == "TP 2 × DP 1 = 2 workers, but an empty CUDA_VISIBLE_DEVICES exposes 0 GPUs"


def test_busy_gpu_fails_vllm_memory_arithmetic():
    c = checks(FIXED_LAUNCH, {"CUDA_VISIBLE_DEVICES": "0,1"}, raw("nvidia-smi-query-busy.csv", "nvidia-smi-apps.csv"))
    free = c["gpus-free"]
    assert free.status == P.FAIL
    assert "GPU 1: 19.1 GiB in use by pid 561 python3;" in free.detail
    assert "vLLM wants 0.9 × 140.4 GiB = 126.4 GiB, 121.3 GiB free" in free.detail
    # a lower utilisation fits next to the other process; it is still worth a warning
    c = checks(
        [*FIXED_LAUNCH, "--gpu-memory-utilization", "0.5"],
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        raw("nvidia-smi-query-busy.csv", "nvidia-smi-apps.csv"),
    )
    assert c["gpus-free"].status == P.WARN
    # only GPU 0 used: the busy GPU 1 is not in the way
    c = checks(
        ["vllm", "serve", "m"], {"CUDA_VISIBLE_DEVICES": "0"}, raw("nvidia-smi-query-busy.csv", "nvidia-smi-apps.csv")
    )
    assert c["gpus-free"].status == P.PASS


def test_torchrun_busy_gpu_is_a_warning():
    c = checks(
        ["torchrun", "--nproc_per_node=2", "train.py"], None, raw("nvidia-smi-query-busy.csv", "nvidia-smi-apps.csv")
    )
    assert c["gpu-count"].status == P.PASS and c["gpu-count"].detail.startswith("nproc_per_node 2 = 2 workers")
    assert c["gpus-free"].status == P.WARN


def test_missing_nvidia_smi_is_a_warning_but_cvd_still_counts():
    c = checks(SEED_LAUNCH, {"CUDA_VISIBLE_DEVICES": "0,1"}, {"nvidia_smi": ["missing"]})
    assert c["nvidia-smi"].status == P.WARN
    assert c["gpu-count"].status == P.FAIL and c["gpu-count"].detail == SEED_FAIL
    c = checks(FIXED_LAUNCH, None, {"nvidia_smi": ["missing"]})
    assert c["gpu-count"].status == P.WARN


def test_model_checks():
    c = checks(["vllm", "serve", "/models/q"], records=raw(model=["absent"]))
    assert c["model"].status == P.FAIL and "/models/q does not exist" in c["model"].detail
    c = checks(["vllm", "serve", "/models/q"], records=raw(model=["present"]))
    assert c["model"].status == P.PASS
    c = checks(FIXED_LAUNCH, records=raw(hf_cache=["absent\t/root/.cache/huggingface/hub"]))
    assert c["model"].status == P.WARN and "downloads it first" in c["model"].detail


def test_inventory_gpu_count_mismatch_warns():
    c = checks(FIXED_LAUNCH, expected=8)
    assert c["inventory"].status == P.WARN and "says 8 GPUs, nvidia-smi lists 2" in c["inventory"].detail


def test_unknown_command_is_a_usage_error():
    with pytest.raises(P.LaunchError):
        P.plan(["python", "train.py"])
    with pytest.raises(P.LaunchError):
        P.plan([])


def test_script_quotes_every_value():
    hostile = "/tmp/m'$(touch x)`y`\n;z"
    launch = parse_launch(["vllm", "serve", hostile])
    script = P.build_script(launch, "@@FD:test", "/opt/odd dir")
    assert "FD_MODEL='/tmp/m'\"'\"'$(touch x)`y`\n;z'" in script
    assert "FD_FPATH='/opt/odd dir'" in script


# ---------------------------------------------------------------- through real sshd


def _inventory_file(tmp_path: Path, sshd, hosts: dict[str, int]) -> Path:
    return inventory_file(tmp_path / "inventory.yaml", {name: {"port": port} for name, port in hosts.items()}, sshd)


def _run(
    sshd,
    tmp_path,
    launch: list[str],
    *opts: str,
    hosts: dict[str, int] | None = None,
    bindir: Path | None = None,
    selectors: list[str] | None = None,
):
    inv = _inventory_file(tmp_path, sshd, hosts or {"uk-node": sshd.port})
    bindir = bindir or fake_nvidia_smi(tmp_path / "bin")
    args = [
        "-i",
        str(inv),
        "--no-color",
        "preflight",
        *(selectors or [",".join(hosts or {"uk-node": 0})]),
        "--path-prepend",
        str(bindir),
        *sshd.cli_args(),
        *opts,
        "--",
        *launch,
    ]
    return CliRunner().invoke(main, args, env={"COLUMNS": "200"})


def test_cli_seed_launch_fails_preflight(sshd, tmp_path):
    result = _run(sshd, tmp_path, SEED_LAUNCH, "--env", "CUDA_VISIBLE_DEVICES=0,1")
    assert result.exit_code == 1, result.output
    assert SEED_FAIL in result.output
    assert "FAIL" in result.output and "uk-node" in result.output


def test_cli_fixed_launch_passes_preflight(sshd, tmp_path):
    result = _run(sshd, tmp_path, FIXED_LAUNCH, "--env", "CUDA_VISIBLE_DEVICES=0,1")
    assert result.exit_code == 0, result.output
    assert "TP 2 × DP 1 = 2 workers; CUDA_VISIBLE_DEVICES=0,1 exposes 2 GPUs" in result.output
    assert "PASS" in result.output


def test_cli_json_inline_env_and_the_queries_made(sshd, tmp_path):
    bindir = fake_nvidia_smi(tmp_path / "bin", "nvidia-smi-query-busy.csv", "nvidia-smi-apps.csv")
    result = _run(sshd, tmp_path, ["CUDA_VISIBLE_DEVICES=0,1", *SEED_LAUNCH], "--json", bindir=bindir)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    assert doc["version"] == 1
    assert doc["launch"]["workers"] == 4 and doc["launch"]["env"] == {"CUDA_VISIBLE_DEVICES": "0,1"}
    host = doc["hosts"][0]
    assert host["status"] == "fail"
    by = {c["name"]: c for c in host["checks"]}
    assert by["gpu-count"] == {"name": "gpu-count", "status": "fail", "detail": SEED_FAIL}
    assert by["gpus-free"]["status"] == "fail" and "GPU 1: 19.1 GiB in use by pid 561" in by["gpus-free"]["detail"]
    assert host["facts"]["gpus"][1]["processes"][0]["pid"] == 561
    assert (bindir / "calls.txt").read_text().splitlines() == [
        "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits",
        "--query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits",
    ]


def test_cli_local_model_path_is_checked_and_quoted(sshd, tmp_path):
    model = tmp_path / "model dir"
    model.mkdir()
    result = _run(sshd, tmp_path, ["vllm", "serve", str(model), "-tp", "2"], "--json")
    assert result.exit_code == 0, result.output
    by = {c["name"]: c for c in json.loads(result.output)["hosts"][0]["checks"]}
    assert by["model"]["status"] == "pass"
    canary = f"fleetdiag-pwned-{uuid.uuid4().hex}"
    hostile = f"/nonexistent/$(touch /tmp/{canary})`touch /tmp/{canary}`"
    result = _run(sshd, tmp_path, ["vllm", "serve", hostile], "--json")
    assert result.exit_code == 1, result.output
    by = {c["name"]: c for c in json.loads(result.output)["hosts"][0]["checks"]}
    assert by["model"]["status"] == "fail"
    assert not Path("/tmp", canary).exists()


def test_cli_unreachable_host_exits_3(sshd, tmp_path):
    result = _run(
        sshd,
        tmp_path,
        FIXED_LAUNCH,
        "--env",
        "CUDA_VISIBLE_DEVICES=0,1",
        hosts={"uk-node": sshd.port, "gone": free_port()},
    )
    assert result.exit_code == 3, result.output
    assert "refused" in result.output and "1/2 hosts ready" in result.output


def test_cli_several_selectors_like_probe(sshd, tmp_path):
    """``preflight gpu01 gpu02 -- vllm serve …``: every selector before ``--`` is checked."""
    hosts = {"gpu01": sshd.port, "gpu02": sshd.port, "gpu03": sshd.port}
    result = _run(
        sshd,
        tmp_path,
        FIXED_LAUNCH,
        "--env",
        "CUDA_VISIBLE_DEVICES=0,1",
        "--json",
        hosts=hosts,
        selectors=["gpu01", "gpu03"],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [h["host"] for h in doc["hosts"]] == ["gpu01", "gpu03"]
    assert doc["launch"]["workers"] == 2


def test_a_launch_it_cannot_read_is_said_and_exits_0(sshd, tmp_path):
    """``python train.py`` and ``deepspeed`` name no GPU count preflight can read: it says what it did not
    judge (stderr, one line) and exits 0, so a wrapper that always runs preflight never stops a job (#25)."""
    for launch in (["python", "train.py"], ["deepspeed", "--num_gpus", "8", "train.py"]):
        result = _run(sshd, tmp_path, launch)
        assert result.exit_code == 0, result.output
        assert "cannot judge the launch" in result.stderr and "nothing was checked" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    result = _run(sshd, tmp_path, ["deepspeed", "train.py"], "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["judged"] is False


def test_cli_usage_errors_exit_2(sshd, tmp_path):
    result = _run(sshd, tmp_path, FIXED_LAUNCH, "--env", "NOEQUALS")
    assert result.exit_code == 2


def test_preflight_host_api(sshd, tmp_path):
    bindir = fake_nvidia_smi(tmp_path / "bin")
    inv = parse_inventory(
        f"hosts:\n  n1:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n    gpus: 2\n", "pf.yaml"
    )
    settings = ProbeSettings(transport=sshd.opts(), path_prepend=str(bindir))
    res = asyncio.run(
        P.preflight_host(inv.hosts["n1"], P.plan(FIXED_LAUNCH, {"CUDA_VISIBLE_DEVICES": "0,1"}), settings)
    )
    assert res.status == "pass", res
    assert {c.name: c.status for c in res.checks}["inventory"] == "pass"
    assert P.exit_code([res]) == 0
