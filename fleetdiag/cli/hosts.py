"""``fleetdiag hosts`` and ``fleetdiag check``: what the inventory resolves to."""

from __future__ import annotations

from dataclasses import asdict

import click
from rich.text import Text

from ..render import plural
from ..render.listing import fits, hosts_lines, hosts_table
from . import Context, complete_selector, handle_errors, main, output_options, pass_ctx, select_hosts


@main.command()
@click.argument("selectors", nargs=-1, shell_complete=complete_selector)
@click.option(
    "--ssh",
    "ssh_view",
    is_flag=True,
    help="What each host resolves to through the ssh config, like ssh -G: HostName, Port, User, "
    "jump chain, identity files, known_hosts.",
)
@click.option("--ssh-config", type=click.Path(dir_okay=False), help="ssh config file (default: ~/.ssh/config).")
@click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False),
    help="known_hosts file (default: ssh config / ~/.ssh/known_hosts).",
)
@click.option("--identity", multiple=True, type=click.Path(dir_okay=False), help="Client key file; repeatable.")
@output_options
@pass_ctx
@handle_errors
def hosts(
    ctx: Context,
    selectors: tuple[str, ...],
    fmt: str | None,
    ssh_view: bool,
    ssh_config: str | None,
    known_hosts: str | None,
    identity: tuple[str, ...],
) -> None:
    """List the resolved hosts and their settings (default: all)."""
    inv = ctx.inventory()
    chosen = select_hosts(inv, selectors or ("all",))
    out = ctx.out
    if ssh_view:
        from ..ssh.reach import TransportOptions

        opts = TransportOptions(
            known_hosts=known_hosts, ssh_config=[ssh_config] if ssh_config else None, client_keys=list(identity) or None
        )
        print_ssh(ctx, inv, chosen, opts, fmt)
        return
    if fmt:
        rows = [{"host": h.name, **asdict(h)} for h in chosen]  # "host" as in every record; "name" kept for v1
        if fmt == "json":
            out.json({"version": 1, "inventory": str(inv.path), "hosts": rows})
        else:
            for row in rows:
                out.jsonl(row)
        return
    title = Text(f"{plural(len(chosen), 'host')} from {out.shown(str(inv.path))}")
    shown = [out.shown(h) for h in chosen]
    table = hosts_table(title, shown)
    if fits(out, table):
        out.print(table)
        return
    # too narrow for the table: one block per host, each address and path whole on its line
    out.print(title, soft_wrap=True)
    for line in hosts_lines(shown):
        out.print(line, soft_wrap=True)


@main.command()
@pass_ctx
@handle_errors
def check(ctx: Context) -> None:
    """Validate the inventory; every error names file, line and key (exit 2)."""
    from ..exitcodes import Exit
    from ..inventory import InventoryError

    try:
        inv = ctx.inventory()
    except InventoryError as exc:
        for e in exc.errors:  # each bad value on its own line, not only the first
            ctx.out.error(ctx.out.markup("[bold red]error:[/] {}", str(e)))
        raise SystemExit(int(Exit.USAGE)) from None
    width = max((len(n) for n in inv.hosts), default=0)
    # what each host will read, so a wrong path is seen before a probe
    lines = [ctx.out.markup("  {} reads {}", h.name.ljust(width), reads(h)) for h in inv.hosts.values()]
    ctx.out.print(
        ctx.out.markup(
            "[green]ok[/]: {}: {}, {}", inv.path, plural(len(inv.hosts), "host"), plural(len(inv.groups), "group")
        ),
        soft_wrap=True,
    )
    for line in lines:
        ctx.out.print(line, soft_wrap=True)


def reads(host) -> str:
    """What ``probe`` will read on ``host`` without ``--log``, in words: the same resolution every
    command uses (``Host.log_source``), so ``check`` accepts exactly the inventories they accept."""
    name, src = host.log_source(None)
    if src.kind == "discover":
        return "the log its job writes, found on the host (no logs: configured)"
    what = {"journal": "journalctl -u {}", "docker": "docker logs {}", "command": "the output of `{}`"}
    return f"{name}: " + what.get(src.kind, "{}").format(src.value)


def ssh_resolution(inv, host, opts) -> dict:
    """One host as the connection will dial it: the inventory's values, then its ssh config."""
    from ..plan import jump_resolver
    from ..probe import host_transport
    from ..ssh.reach import parse_jump_chain
    from ..ssh.transport import resolve

    r = resolve(host.target, host.port, host.user, host_transport(host, opts))  # its own key first, as probe
    doc = {"host": host.name, **r.to_json(), "where": r.where, "jump_from": "ssh config" if r.jump else None}
    if host.jump:  # the inventory's jump wins over ProxyJump, hop by hop as the transport reads it
        resolver = jump_resolver(inv)
        hops = []
        for hop in parse_jump_chain(host.jump) if "," in host.jump else [None]:
            t, p, u = resolver(host.jump) if hop is None else (hop.host, hop.port, hop.user)
            hr = resolve(t, p, u, opts)
            hops.append(f"{hr.user}@{hr.where}")
        doc["jump"], doc["jump_from"] = hops, "inventory"
    return doc


def print_ssh(ctx: Context, inv, chosen: list, opts, fmt: str | None) -> None:
    """``hosts --ssh``: ``ssh -G``'s answer per host, in the words fleetdiag uses."""
    out = ctx.out
    docs = [ssh_resolution(inv, h, opts) for h in chosen]
    if fmt == "json":
        out.json({"version": 1, "inventory": str(inv.path), "hosts": docs})
        return
    if fmt == "jsonl":
        for d in docs:
            out.jsonl(d)
        return
    out.print(Text(f"{plural(len(docs), 'host')} from {out.shown(str(inv.path))}, as ssh will reach them"))
    for d in docs:
        d = out.shown(d)
        out.print(Text.assemble((d["host"], "bold"), "  ", (d["where"], "")), soft_wrap=True)
        rows = [
            ("hostname", d["hostname"]),
            ("port", str(d["port"])),
            ("user", d["user"]),
            ("proxyjump", " → ".join(d["jump"]) + f"  ({d['jump_from']})" if d["jump"] else "none"),
            ("identityfile", ", ".join(d["identity_files"]) or "agent and ~/.ssh defaults"),
            ("knownhosts", ", ".join(d["known_hosts"])),
            ("config", ", ".join(d["config_files"]) or "none"),
        ]
        for k, v in rows:
            out.print(Text.assemble(("  " + k.ljust(13), "dim"), v), soft_wrap=True)
