"""``fleetdiag analyze``: the same funnel and analysis on a local log, no SSH."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile

import click

from ..evidence.host import apply_collection
from ..exitcodes import exit_for
from ..probe import finish, spec_for
from ..records import HEALTHY, FunnelResult, HostResult
from ..remote import funnel as funnel_mod
from . import DURATION, Context, handle_errors, main, output_options, pass_ctx


@main.command()
@click.argument("path", type=click.Path(allow_dash=True), required=False)
@click.option(
    "--kernel",
    "kernel_file",
    metavar="FILE",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="The host's kernel log (dmesg, dmesg -T/-H, journalctl -k in any short format, kern.log): "
    "decided with the log as probe decides it. Without PATH: the kernel log alone.",
)
@click.option(
    "--smi",
    "smi_file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="The host's nvidia-smi output (nvidia-smi -q, --query-gpu CSV, or the table): its GPU health.",
)
@click.option(
    "--stall-after",
    type=DURATION,
    default="10m",
    show_default=True,
    help="No growth for this long (10m, 600s, or seconds): a starting log counts as stalled.",
)
@output_options(jsonl_help="The host record as one JSON line (for a pipe), not indented.")
@pass_ctx
@handle_errors
def analyze(
    ctx: Context,
    path: str | None,
    kernel_file: str | None,
    smi_file: str | None,
    fmt: str | None,
    stall_after: float,
) -> None:
    """Analyse a local log file (or - for stdin) exactly as probe does remotely; with --kernel and --smi,
    a ticket's kernel log and nvidia-smi output too."""
    if path is None and kernel_file is None and smi_file is None:
        raise click.UsageError("give a log file (or - for stdin), or --kernel FILE for a kernel log alone")
    if kernel_file == "-" and path == "-":
        raise click.UsageError("stdin can be the log or the kernel log (--kernel -), not both")
    for opt, f in (("--kernel", kernel_file), ("--smi", smi_file)):
        if f is not None and f != "-" and (not os.path.exists(f) or os.path.isdir(f)):
            raise click.BadParameter(f"{f}: no such file", param_hint=opt)
    kc = None
    if kernel_file is not None or smi_file is not None:
        from ..evidence.kernel import KernelCollection
        from ..evidence.offline import add_smi_file, read_kernel_file

        if kernel_file == "-" and getattr(sys.stdin, "buffer", None) is None:
            raise click.UsageError("'--kernel -' reads the kernel log from stdin, but stdin is closed")
        kc = (
            read_kernel_file(sys.stdin if kernel_file == "-" else kernel_file)
            if kernel_file
            else KernelCollection(smi_status="not-given")
        )
        if smi_file:
            add_smi_file(kc, smi_file)
    if path is None:
        res = _kernel_only(kc)
        _emit(ctx, res, fmt)
    rules = ctx.rules()
    if ctx.redactor is not None:  # the fleet's names are known: hide them in a local log too
        from ..inventory import InventoryError

        try:
            ctx.inventory()
        except InventoryError:
            pass
    tmp = None
    try:
        if path == "-":
            if getattr(sys.stdin, "buffer", None) is None:  # started with stdin closed (`<&-`)
                raise click.UsageError("'-' reads the log from stdin, but stdin is closed: pass a file, or pipe one in")
            fd, tmp = tempfile.mkstemp(prefix="fleetdiag-stdin-", suffix=".log")
            with os.fdopen(fd, "wb") as fh:
                shutil.copyfileobj(sys.stdin.buffer, fh)
            target = tmp
        else:
            if not os.path.exists(path):  # the user's input, not a host's state
                raise click.BadParameter(f"{path}: no such file", param_hint="PATH")
            target = os.path.abspath(path)
            if stat.S_ISFIFO(os.stat(path).st_mode):
                # `analyze <(kubectl logs pod)`, a named FIFO: read as stdin is (the funnel reads regular files
                # only, since on a host a FIFO could block it), and never remembered for an early start
                fd, tmp = tempfile.mkstemp(prefix="fleetdiag-pipe-", suffix=".log")
                with os.fdopen(fd, "wb") as fh, open(path, "rb") as src:
                    shutil.copyfileobj(src, fh)
                target = tmp
        fr = _funnel(spec_for(target, rules), rules.sources if path != "-" and tmp is None else None)
        res = finish("-" if path == "-" else path, fr, rules, stall_after)
        if kc is not None:
            res = apply_collection(res, fr, kc, live=False)
        if path == "-":
            res.log = "<stdin>"
        elif tmp is not None:
            res.log = path
    finally:
        if tmp:
            os.unlink(tmp)
    _emit(ctx, res, fmt)


def _funnel(spec: funnel_mod.FunnelSpec, remember: list[str] | None) -> FunnelResult:
    """``funnel.run_local``, taking the output of the same script when the entry point started it before
    the imports (``ssh.keeper.ahead``); ``remember``: the rules files, and the next identical command line
    starts it so (None: not remembered, a log read from stdin)."""
    from ..ssh.keeper import ahead

    script, mark = ahead.local_script(lambda m: funnel_mod.local_script(spec, m))
    raw = ahead.local_output(script)
    if raw is None:
        raw = funnel_mod.run_script(script)
    if remember is not None:
        ahead.remember_local(files=remember)
    return funnel_mod.parse_output(raw.decode("utf-8", "replace"), mark)


def _kernel_only(kc: object) -> HostResult:
    """No application log: the host as its kernel log and GPU health alone say (healthy or degraded)."""
    res = HostResult(host="-", verdict=HEALTHY, summary="no application log given: the kernel log and GPU health alone")
    return apply_collection(res, FunnelResult(status="ok"), kc, live=False)  # type: ignore[arg-type]


def _emit(ctx: Context, res: HostResult, fmt: str | None) -> None:
    if fmt in ("json", "jsonl"):
        ctx.out.json(res.to_json(), indent=2 if fmt == "json" else None)
    else:
        from ..render import host_card

        ctx.out.print(host_card(ctx.out.shown(res)))
    raise SystemExit(int(exit_for([res])))
