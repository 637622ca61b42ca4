"""Preflight: check a planned launch against each host's GPUs before it runs.

The seeds' launch (``vllm serve … -tp 2 -dp 2`` under
``CUDA_VISIBLE_DEVICES=0,1``) could only ever die: it needs 4 GPU workers and
sees 2. Finding that afterwards took four rounds of grepping; checking the
command against ``nvidia-smi`` first takes one exec per host.

Per host, one read-only script (the same GPU snippet the probe uses, the
login environment's ``CUDA_VISIBLE_DEVICES``, and ``test -e`` on a local
model path, every value single-quoted) and these checks:

``nvidia-smi``   the GPUs can be listed (missing is a warning: nothing to compare)
``gpu-ids``      every CUDA_VISIBLE_DEVICES entry names a GPU of this host
``gpu-count``    workers needed (TP × PP × DP, nproc_per_node) ≤ GPUs visible
``gpus-free``    the GPUs the launch will use hold no other process / memory
``model``        a local model path exists (a Hugging Face id: is it cached?)
``inventory``    nvidia-smi's GPU count matches the inventory's ``gpus``

Core only: no click, no rich. ``cli/preflight.py`` draws the table.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import facts as facts_mod
from . import remote
from .facts import Launch, fmt_mib, visibility, workers
from .probe import HostLike, ProbeSettings, open_host
from .records import CheckStatus
from .remote import funnel as funnel_mod
from .ssh.reach import HostError, PartialOutput

PASS, WARN, FAIL, SKIP = CheckStatus.PASS, CheckStatus.WARN, CheckStatus.FAIL, CheckStatus.SKIP
UNREACHABLE = CheckStatus.UNREACHABLE
BUSY_MIB = 1024  # memory in use that makes a GPU "busy" without a process to show for it
VLLM_DEFAULT_UTIL = 0.9


@dataclass
class Check:
    name: str
    status: str  # pass | warn | fail | skip
    detail: str


@dataclass
class PreflightResult:
    """One host's verdict on the launch: ``fail`` if any check fails."""

    host: str
    status: str  # pass | fail | unreachable
    address: str | None = None
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    elapsed_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LaunchError(ValueError):
    """The command is not a launch preflight understands (usage error, exit 2)."""


def plan(command: Sequence[str], env: Mapping[str, str] | None = None) -> Launch:
    """Parse the launch command; raise LaunchError when no GPU count can be read from it."""
    if not command:
        raise LaunchError("no launch command: put it after --, e.g. preflight gpu01 -- vllm serve MODEL -tp 2")
    launch = facts_mod.parse_launch(list(command), env)
    if launch.launcher is None:
        raise LaunchError(
            f"not a launch preflight understands: {' '.join(command)[:120]!r} "
            "(supported: vllm serve, python -m vllm.entrypoints…, torchrun, python -m torch.distributed.run, "
            "python -m sglang.launch_server)"
        )
    return launch


# ---------------------------------------------------------------- the remote script

_SCRIPT = remote.load("preflight.sh") + facts_mod.GPU_SNIPPET + remote.load("end.sh")


def model_kind(model: str | None) -> str:
    """``local`` (a path), ``home`` (``~/…``), ``hf`` (an org/name id) or ``unknown``."""
    if not model:
        return "unknown"
    if model.startswith("~/"):
        return "home"
    if model.startswith(("/", "./", "../")):
        return "local"
    parts = model.split("/")
    if len(parts) == 2 and all(parts):
        return "hf"
    return "unknown"


def build_script(launch: Launch, mark: str, path_prepend: str | None = None) -> str:
    """The host's script: quoted assignments, then fixed text (no value is ever spliced into code)."""
    kind = model_kind(launch.model)
    env = launch.env
    hf_cache = env.get("HF_HUB_CACHE") or (env["HF_HOME"].rstrip("/") + "/hub" if env.get("HF_HOME") else "")
    values = {
        "FD_MARK": mark,
        "FD_MODEL": launch.model if kind == "local" else "",
        "FD_MODEL_HOME": launch.model[2:] if kind == "home" and launch.model else "",
        "FD_HF_REPO": "models--" + launch.model.replace("/", "--") if kind == "hf" and launch.model else "",
        "FD_HF_CACHE": hf_cache,
        **facts_mod.snippet_vars(path_prepend),
    }
    values.pop("rp", None)
    return remote.script(values, _SCRIPT)


# ---------------------------------------------------------------- the checks (pure)


def evaluate(
    launch: Launch, raw: Mapping[str, list[str]], expected_gpus: int | None = None
) -> tuple[list[Check], dict[str, Any]]:
    """The checks for one host, from the script's records. Pure: the tests feed it fixtures."""
    facts = facts_mod.build(raw)
    gpus: list[dict[str, Any]] | None = facts.get("gpus")
    checks: list[Check] = []

    def one(key: str) -> str | None:
        v = raw.get(key)
        return v[-1] if v else None

    # which CUDA_VISIBLE_DEVICES the launch will run under
    cvd = launch.cuda_visible_devices
    cvd_from = "the command" if cvd is not None else None
    if cvd is None and one("login_cvd") is not None:
        cvd, cvd_from = one("login_cvd"), "the host's login environment"
    if cvd is not None:
        facts["cuda_visible_devices"] = cvd
        facts["cuda_visible_devices_source"] = cvd_from
    facts["parallel"] = launch.parallel()

    smi = facts.get("nvidia_smi")
    if smi == "ok":
        checks.append(Check("nvidia-smi", PASS, facts_mod.gpu_summary(gpus or [])))
    elif smi == "missing":
        checks.append(
            Check("nvidia-smi", WARN, "nvidia-smi not found on PATH (use --path-prepend DIR): GPUs not checked")
        )
    elif smi:
        checks.append(
            Check("nvidia-smi", FAIL, f"nvidia-smi {smi}: the driver is not answering, a launch would fail too")
        )
    else:
        checks.append(Check("nvidia-smi", WARN, "no answer from the GPU query"))

    vis = visibility(cvd, gpus)
    if cvd is not None and not cvd.strip():
        checks.append(
            Check("gpu-ids", WARN, f"CUDA_VISIBLE_DEVICES is set but empty (from {cvd_from}): every GPU is hidden")
        )
    elif cvd is not None and gpus is not None:
        if vis.invalid:
            checks.append(Check("gpu-ids", FAIL, vis.text))
        else:
            checks.append(
                Check(
                    "gpu-ids",
                    PASS,
                    f"CUDA_VISIBLE_DEVICES={cvd} (from {cvd_from}): "
                    f"GPU{'s' if len(vis.indices) != 1 else ''} {_list(vis.indices)} "
                    f"exist{'' if len(vis.indices) != 1 else 's'}",
                )
            )

    n, arith = workers(launch.parallel(), launch.launcher, launch.dp_attention)
    checks.append(_count_check(launch, n, arith, vis))
    checks.append(_free_check(launch, n, vis, gpus))
    checks.append(_model_check(launch, one("model"), raw.get("hf_cache")))
    if expected_gpus is not None and gpus is not None:
        if len(gpus) != expected_gpus:
            checks.append(
                Check("inventory", WARN, f"the inventory says {expected_gpus} GPUs, nvidia-smi lists {len(gpus)}")
            )
        else:
            checks.append(Check("inventory", PASS, f"{len(gpus)} GPUs, as the inventory says"))
    for note in launch.notes:
        checks.append(Check("command", WARN, note))
    return checks, facts


def _list(ix: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ix) if ix else "none"


def _count_check(launch: Launch, n: int | None, arith: str, vis: facts_mod.Visibility) -> Check:
    if n is None:
        spec = launch.nproc_spec
        if spec in ("gpu", "auto") and vis.count is not None:
            return Check(
                "gpu-count",
                PASS if vis.count > 0 else FAIL,
                f"nproc_per_node={spec}: one worker per visible GPU; {vis.text}",
            )
        if spec == "cpu":
            return Check("gpu-count", SKIP, "nproc_per_node=cpu: no GPUs needed")
        return Check("gpu-count", SKIP, "cannot tell the workers this launch needs")
    if vis.count is None:
        return Check(
            "gpu-count", WARN, f"{arith}; the visible GPUs are unknown (no nvidia-smi, no CUDA_VISIBLE_DEVICES)"
        )
    if n > vis.count:
        status = FAIL
        tail = ""
        if launch.backend == "ray":
            status, tail = WARN, " (Ray backend: workers may run on other nodes)"
        return Check("gpu-count", status, f"{arith}, but {vis.text}{tail}")
    used = f" (uses {n} of {vis.count})" if n < vis.count else ""
    return Check("gpu-count", PASS, f"{arith}; {vis.text}{used}")


def _free_check(launch: Launch, n: int | None, vis: facts_mod.Visibility, gpus: list[dict[str, Any]] | None) -> Check:
    if not gpus:
        return Check("gpus-free", SKIP, "no GPU list")
    by_index = {int(g["index"]): g for g in gpus}
    use = vis.indices[:n] if n is not None else vis.indices
    if not use:
        return Check("gpus-free", SKIP, "no GPU would be used")
    util = None
    what = ""
    if facts_mod.VLLM == launch.launcher:
        util = launch.gpu_memory_utilization or VLLM_DEFAULT_UTIL
        what = f"vLLM wants {util:g} ×"
    elif launch.launcher == facts_mod.SGLANG and launch.mem_fraction_static:
        util = launch.mem_fraction_static
        what = f"SGLang wants {util:g} ×"
    bad: list[str] = []
    warn: list[str] = []
    for i in use:
        g = by_index.get(i)
        if g is None:
            continue
        used = g.get("memory_used_mib") or 0
        total = g.get("memory_total_mib")
        procs = g.get("processes") or []
        who = ", ".join(
            f"pid {p['pid']} {(p.get('cmdline') or p.get('name') or '')[:60]}".rstrip()
            + (f" {fmt_mib(p['used_mib'])}" if p.get("used_mib") and len(procs) > 1 else "")
            for p in procs[:3]
        ) + (f", … {len(procs) - 3} more" if len(procs) > 3 else "")
        held = f"GPU {i}: {fmt_mib(used)} in use" + (f" by {who}" if who else "")
        if util is not None and total:
            need = util * total
            free = total - used
            if free < need:
                bad.append(f"{held}; {what} {fmt_mib(total)} = {fmt_mib(need)}, {fmt_mib(free)} free")
                continue
        if procs or used > BUSY_MIB:
            warn.append(held)
    if bad:
        return Check("gpus-free", FAIL, "; ".join(bad + warn))
    if warn:
        return Check("gpus-free", WARN, "; ".join(warn))
    return Check(
        "gpus-free",
        PASS,
        f"GPU{'s' if len(use) != 1 else ''} {_list(use)} idle (no process, under {fmt_mib(BUSY_MIB)} used)",
    )


def _model_check(launch: Launch, model: str | None, hf: list[str] | None) -> Check:
    kind = model_kind(launch.model)
    if kind in ("local", "home"):
        if model == "present":
            return Check("model", PASS, f"{launch.model} exists")
        return Check("model", FAIL, f"{launch.model} does not exist on this host")
    if kind == "hf":
        state = (hf[-1] if hf else "").split("\t")
        if state[0] == "present":
            return Check(
                "model", PASS, f"{launch.model}: in the Hugging Face cache ({state[1] if len(state) > 1 else ''})"
            )
        where = f" ({state[1]})" if len(state) > 1 else ""
        return Check(
            "model", WARN, f"{launch.model}: not in the Hugging Face cache{where}: the launch downloads it first"
        )
    if launch.model:
        return Check("model", SKIP, f"{launch.model}: neither a path nor an org/name id: not checked")
    return Check("model", SKIP, "no model in the command")


# ---------------------------------------------------------------- running it


async def preflight_host(host: HostLike, launch: Launch, settings: ProbeSettings) -> PreflightResult:
    """One exec on one host; never raises for a host-side problem."""
    t0 = time.perf_counter()
    res = PreflightResult(host=host.name, status=UNREACHABLE, address=host.target)
    conn = None
    try:
        conn = await open_host(host, settings)
        mark = funnel_mod.new_mark()
        command = funnel_mod.remote_command(build_script(launch, mark, settings.path_prepend))
        try:
            out, _status, _open, _ms = await conn.run(command, settings.transport.command_timeout)
        except PartialOutput as exc:
            out = exc.data
        fr = funnel_mod.parse_output(out.decode("utf-8", "replace"), mark)
        if fr.status == "error":
            res.error = "; ".join(fr.markers) or "no answer from the host's shell"
        else:
            res.checks, res.facts = evaluate(launch, fr.facts.get("raw", {}), getattr(host, "gpus", None))
            if any(m.startswith("funnel output ended early") for m in fr.markers):
                res.checks.append(Check("host", WARN, "the check script was cut short: results may be partial"))
            res.status = FAIL if any(c.status == FAIL for c in res.checks) else PASS
    except HostError as exc:
        res.error = str(exc)
        res.facts["error_kind"] = exc.kind  # PreflightResult: its facts are its own record
    finally:
        if conn is not None:
            conn.close()
    res.elapsed_ms = round((time.perf_counter() - t0) * 1000, 1)
    return res


async def preflight_many(
    hosts: Sequence[HostLike], launch: Launch, settings: ProbeSettings, fanout: int = 64
) -> AsyncIterator[PreflightResult]:
    """Bounded fanout; results as each host answers."""
    sem = asyncio.Semaphore(max(1, fanout))

    async def one(host: HostLike) -> PreflightResult:
        async with sem:
            return await preflight_host(host, launch, settings)

    tasks = [asyncio.ensure_future(one(h)) for h in hosts]
    try:
        for fut in asyncio.as_completed(tasks):
            yield await fut
    finally:
        for t in tasks:
            t.cancel()


def exit_code(results: Sequence[PreflightResult]) -> int:
    """0 every check passed (warnings allowed) · 1 a check failed · 3 a host unreachable (exitcodes.py decides)."""
    from .exitcodes import preflight_exit

    return preflight_exit(results)


def report_json(launch: Launch, results: Sequence[PreflightResult]) -> dict[str, Any]:
    ld = launch.to_dict()
    return {
        "version": 1,
        "launch": {
            k: ld[k]
            for k in (
                "argv",
                "launcher",
                "env",
                "model",
                "tp",
                "dp",
                "pp",
                "dp_local",
                "nproc_per_node",
                "nnodes",
                "workers",
                "arithmetic",
            )
        },
        "hosts": [r.to_json() for r in results],
    }


__all__ = [
    "Check",
    "LaunchError",
    "PreflightResult",
    "build_script",
    "evaluate",
    "exit_code",
    "plan",
    "preflight_host",
    "preflight_many",
    "report_json",
    "model_kind",
]
