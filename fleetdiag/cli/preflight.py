"""``fleetdiag preflight``: will this launch fit the hosts' GPUs? Checked before it runs."""

from __future__ import annotations

import asyncio

import click

from ..exitcodes import preflight_exit
from ..plan import jump_resolver
from ..preflight import LaunchError, PreflightResult, plan, preflight_many, report_json
from ..probe import ProbeSettings
from ..render import preflight_view
from ..ssh.scheduler import DEFAULT_FANOUT
from . import (
    Context,
    complete_selector,
    handle_errors,
    main,
    output_options,
    pass_ctx,
    select_hosts,
    transport_from,
    transport_options,
)


class _LaunchAfterDashes(click.Command):
    """Selectors before ``--``, the launch after it (``preflight gpu01 gpu02 -- vllm serve …``).

    click drops the ``--`` itself, so two variadic arguments cannot be told apart
    after parsing: the launch is split off here first. Without ``--`` the first
    argument is the selector and the rest the launch, as before."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            i = args.index("--")
            ctx.meta["preflight.launch"] = tuple(args[i + 1 :])
            args = args[:i]
        return super().parse_args(ctx, args)


def parse_env(items: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE", param_hint="--env")
        env[key] = value
    return env


@main.command(cls=_LaunchAfterDashes, context_settings={"ignore_unknown_options": False})
@click.argument("selectors", nargs=-1, required=True, shell_complete=complete_selector)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="NAME=VALUE",
    help="Environment the launch will run under, e.g. --env CUDA_VISIBLE_DEVICES=0,1 (repeatable).",
)
@click.option(
    "--path-prepend", metavar="DIR", help="Remote directory put before PATH (nvidia-smi outside the default PATH)."
)
@click.option(
    "--fanout", type=click.IntRange(1), default=DEFAULT_FANOUT, show_default=True, help="Hosts checked at once."
)
@output_options
@transport_options
@pass_ctx
@handle_errors
def preflight(
    ctx: Context,
    selectors: tuple[str, ...],
    env_items: tuple[str, ...],
    path_prepend: str | None,
    fanout: int,
    fmt: str | None,
    **kw,
) -> None:
    """Check a planned launch against each selected host's GPUs before it runs.

    \b
    fleetdiag preflight uk-node --env CUDA_VISIBLE_DEVICES=0,1 -- vllm serve MODEL -tp 2 -dp 2
    fleetdiag preflight 'gpu[01-04]' -- torchrun --nproc_per_node 8 train.py
    fleetdiag preflight gpu01 gpu02 -- vllm serve MODEL -tp 8

    Put the launch command after --. Checks, per host: workers needed
    (TP × PP × DP, nproc_per_node) against the GPUs visible under the given
    environment (--env, else VAR=val prefixes of the command, else the host's
    login environment), the GPUs already busy (memory used, other processes),
    a local model path. Exit 0: every check passed (warnings allowed); 1: a
    check failed; 2: usage; 3: a host was unreachable.
    """
    command = click.get_current_context().meta.get("preflight.launch")
    if command is None:  # no --: the first argument selects, the rest is the launch
        selectors, command = selectors[:1], selectors[1:]
    try:
        launch = plan(command, parse_env(env_items))
    except LaunchError as exc:
        if not command:
            raise click.UsageError(str(exc)) from None
        # A launch it cannot read (python train.py, deepspeed …) is not the user's mistake: say what
        # was not judged and exit 0, so a wrapper that always runs preflight does not stop the job.
        why = str(exc).replace("not a launch preflight understands:", "cannot judge the launch", 1)
        why = why.replace(" (supported:", ": its GPU count is not on its command line (judged:", 1)
        if fmt in ("json", "jsonl"):
            ctx.out.json({"version": 1, "judged": False, "launch": list(command), "why": why}, indent=None)
        else:
            ctx.out.error(f"fleetdiag preflight: {why}; nothing was checked", style="yellow", soft_wrap=True)
        raise SystemExit(0) from None
    inv = ctx.inventory()
    hosts = select_hosts(inv, selectors)
    settings = ProbeSettings(transport=transport_from(kw), jump_resolver=jump_resolver(inv), path_prepend=path_prepend)
    results: list[PreflightResult] = []
    out = ctx.out

    async def go() -> None:
        async for res in preflight_many(hosts, launch, settings, fanout):
            results.append(res)
            if fmt == "jsonl":
                out.jsonl(res.to_json())

    asyncio.run(go())
    order = {h.name: i for i, h in enumerate(hosts)}
    results.sort(key=lambda r: order.get(r.host, 0))
    if fmt == "json":
        out.json(report_json(launch, results))
    elif fmt is None:
        for item in preflight_view(launch, [out.shown(r) for r in results], out.shown(launch.to_dict())):
            out.print(item)
    raise SystemExit(int(preflight_exit(results)))
