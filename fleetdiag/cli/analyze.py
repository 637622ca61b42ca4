"""``fleetdiag analyze``: the same funnel and analysis on a local log, no SSH."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import click

from ..exitcodes import exit_for
from ..funnel import run_local
from ..probe import finish, spec_for
from ..render import host_card
from . import DURATION, Context, handle_errors, main, output_options, pass_ctx


@main.command()
@click.argument("path", type=click.Path(allow_dash=True))
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
def analyze(ctx: Context, path: str, fmt: str | None, stall_after: float) -> None:
    """Analyse a local log file (or - for stdin) exactly as probe does remotely."""
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
        fr = run_local(spec_for(target, rules))
        res = finish("-" if path == "-" else path, fr, rules, stall_after)
        if path == "-":
            res.log = "<stdin>"
    finally:
        if tmp:
            os.unlink(tmp)
    if fmt in ("json", "jsonl"):
        ctx.out.json(res.to_json(), indent=2 if fmt == "json" else None)
    else:
        ctx.out.print(host_card(ctx.out.shown(res)))
    raise SystemExit(int(exit_for([res])))
