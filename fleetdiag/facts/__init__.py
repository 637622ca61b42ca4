"""Host facts: the GPUs, the serving process and its parallelism, gathered in the probe's own round trip.

The seeds' failure (TP 2 × DP 2 under ``CUDA_VISIBLE_DEVICES=0,1``) is only
obvious once the error is put next to the host's GPUs and the launch's
parallel sizes. So the funnel script carries a small read-only snippet
(:data:`SNIPPET`) that asks ``nvidia-smi`` for the GPUs and their compute
processes, finds the serving process (``vllm serve``, torchrun, SGLang) with
its command line and ``CUDA_VISIBLE_DEVICES`` (from ``/proc/PID/environ``),
and greps the latest run of the log for the parallel settings. It prints
``F<TAB>key<TAB>value`` records; :func:`build` turns them into the ``facts``
dict of a HostResult, and :func:`refine_hint` puts the arithmetic into the
decisive error's hint.

Everything here is pure (no SSH, no UI); the shell text is data. The
package has one owner per job:

``collect``     the snippets' variables and :func:`build` / :func:`merge_log_facts`
``nvidia_smi``  nvidia-smi parsers, rows checked so garbage never counts as GPUs
``launch``      launch command lines, parallel sizes from the log, :func:`workers`
``gpus``        :func:`visibility`: CUDA_VISIBLE_DEVICES by CUDA's rule
``hints``       the fact-aware hints: rule fields and :func:`refine_hint`
``text``        short card text

The facts dict (JSON, ``HostResult.facts``), every key optional:

``nvidia_smi``
    ``"ok"``, ``"missing"`` (not on PATH: a fact, not an error) or
    ``"failed: <first line>"`` (driver trouble, or output that is not GPU rows).
``gpus``
    ``[{index, name, uuid, memory_used_mib, memory_total_mib, utilization_pct,
    processes: [{pid, name, used_mib, cmdline}]}]``.
``cuda_visible_devices``
    the serving process's value (or the log's ``Setting CUDA_VISIBLE_DEVICES=``),
    a string; absent when unknown. ``cuda_visible_devices_source`` says where from.
``serving``
    ``{pid, cmdline, launcher, writes_log, environ, candidates}``.
``parallel``
    ints only: ``tp``, ``dp``, ``pp``, ``dp_local``, ``nproc_per_node``,
    ``nnodes``, ``dp_attention`` (1: SGLang's DP shares the TP GPUs);
    ``parallel_source`` says where they were read.
"""

from __future__ import annotations

from .. import units as _units

# One owner for secrets: redact.py (re-exported for the modules that import them from facts).
from ..redact import SECRET_NAME as _SECRET_NAME  # noqa: F401
from ..redact import redact_argv, redact_cmdline, redact_env
from .collect import (
    BASE_SNIPPET,
    FACTS_TIMEOUT,
    GPU_SNIPPET,
    LOG_ERE,
    SERVE_ERE,
    SERVE_SNIPPET,
    SMI_CAP,
    SNIPPET,
    build,
    merge_log_facts,
    snippet_vars,
)
from .gpus import Visibility, gpu_index, visibility
from .hints import fields, refine_hint
from .launch import (
    SGLANG,
    TORCHRUN,
    VLLM,
    Launch,
    launcher_of,
    parallel_from_log,
    parse_launch,
    parse_non_default_args,
    workers,
    workers_of,
)
from .nvidia_smi import (
    APP_QUERY,
    GPU_QUERY,
    Gpu,
    GpuProcess,
    attach_processes,
    parse_apps_csv,
    parse_gpu_csv,
    parse_smi_list,
    parse_smi_table,
    read_gpu_csv,
)
from .text import gpu_summary, short_cmd, summary_lines

fmt_gib = _units.gib  # older names for units.gib / units.mib
fmt_mib = _units.mib

__all__ = [
    "APP_QUERY",
    "FACTS_TIMEOUT",
    "GPU_QUERY",
    "BASE_SNIPPET",
    "GPU_SNIPPET",
    "LOG_ERE",
    "SERVE_ERE",
    "SERVE_SNIPPET",
    "SGLANG",
    "SMI_CAP",
    "SNIPPET",
    "TORCHRUN",
    "VLLM",
    "Gpu",
    "GpuProcess",
    "Launch",
    "Visibility",
    "attach_processes",
    "build",
    "fields",
    "fmt_gib",
    "fmt_mib",
    "gpu_index",
    "gpu_summary",
    "launcher_of",
    "merge_log_facts",
    "parallel_from_log",
    "parse_apps_csv",
    "parse_gpu_csv",
    "parse_launch",
    "parse_non_default_args",
    "parse_smi_list",
    "parse_smi_table",
    "read_gpu_csv",
    "redact_argv",
    "redact_cmdline",
    "redact_env",
    "refine_hint",
    "short_cmd",
    "snippet_vars",
    "summary_lines",
    "visibility",
    "workers",
    "workers_of",
]
