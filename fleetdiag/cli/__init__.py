"""The command line: parses, calls the core, renders. Errors become exit codes here."""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
from rich.text import Text

from .. import __version__
from ..exitcodes import Exit
from ..render import Output
from ..ssh.reach import COMMAND_TIMEOUT, CONNECT_TIMEOUT

T = TypeVar("T")


class Context:
    """What every command gets: the one Output it writes through, and the global options."""

    def __init__(self, out: Output, inventory: str | None, rules: tuple[str, ...], debug: bool = False):
        self.out = out
        self.inventory_arg = inventory
        self.rules_files = rules
        self.debug = debug
        self._rules = None
        self._inventory: tuple[str | None, Any] | None = None

    def set_output(self, color: bool | None = None, redact: bool = False) -> None:
        """Rebuild the Output when a subcommand repeats --color/--no-color or --redact."""
        redactor = self.out.redactor
        if redact and redactor is None:
            from ..redact import Redactor

            redactor = Redactor()
        self.out = Output(color=self.out.color if color is None else color, redactor=redactor)

    @property
    def env(self) -> Output:  # the older name of ``out``
        return self.out

    @property
    def redactor(self):
        """The --redact redactor (None when off); the Output applies it."""
        return self.out.redactor

    def redact(self, res):
        """The result as it may be shown: redacted under --redact (results themselves stay real)."""
        return self.out.redacted(res)

    def rules(self):
        from ..analysis import load_rules

        if self._rules is None:
            self._rules = load_rules(extra=list(self.rules_files))
        return self._rules

    def rules_soon(self):
        """Start loading the rules in a thread and return its Future: a probe connects meanwhile."""
        import concurrent.futures
        import threading

        fut: concurrent.futures.Future = concurrent.futures.Future()

        def load() -> None:
            try:
                fut.set_result(self.rules())
            except BaseException as exc:  # handed to whoever waits for the rules
                fut.set_exception(exc)

        threading.Thread(target=load, name="fleetdiag-rules", daemon=True).start()
        return fut

    def inventory(self):
        """The inventory, loaded once per command (its warnings said once, however often it is asked for)."""
        from ..inventory import find_inventory, load_inventory

        key = self.inventory_arg
        if self._inventory is not None and self._inventory[0] == key:
            inv = self._inventory[1]
        else:
            inv = load_inventory(find_inventory(key))
            self._inventory = (key, inv)
            for w in getattr(inv, "warnings", []):  # keys read but not used are named, never dropped silently
                self.out.error(f"warning: {w}", style="yellow", markup=False, highlight=False, soft_wrap=True)
        if self.redactor is not None:
            self.redactor.seed_inventory(inv)
        return inv


pass_ctx = click.make_pass_decorator(Context)


class Duration(click.ParamType):
    """``90s``, ``10m``, ``1h30m``, ``500ms`` or plain seconds: one duration type for every option."""

    name = "DURATION"

    def __init__(self, unit: float = 1.0, min_open: bool = False) -> None:
        self.unit = unit  # a plain number counts in this many seconds (days for --keep-days)
        self.min_open = min_open

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        from ..units import parse_duration

        try:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return parse_duration(value)  # a default, already in this option's unit
            text = str(value).strip() if not isinstance(value, bool) else value
            try:
                float(text)
            except (TypeError, ValueError):
                seconds = parse_duration(text)  # with a unit: 90d, 2m
            else:
                seconds = parse_duration(text) * self.unit  # a plain number counts in the option's unit
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if self.min_open and seconds <= 0:
            self.fail(f"must be more than 0, got {value!r}", param, ctx)
        return seconds / self.unit


DURATION = Duration()


def select_hosts(inv: Any, selectors: tuple[str, ...] | list[str]) -> list[Any]:
    """The selected hosts; an empty selection is a usage error naming the selector, never "all healthy"."""
    from ..inventory import SelectorError, select

    hosts = select(inv, selectors)
    if not hosts:
        sel = ",".join(selectors)
        raise SelectorError(f"selector '{sel}' selects no host (see `fleetdiag hosts all`)", term=sel)
    return hosts


def check_logs(hosts: list[Any], log: str | None, need_file: bool = False) -> None:
    """Every selected host must know which log to read (``--log NAME``, its first log, or discovery on the
    host when it names none; ``need_file``: a file, as ``watch`` follows one): a configuration mistake is a
    usage error, all of them at once, before any connection, never a host state."""
    from ..inventory import InventoryError

    errors: list[str] = []
    for h in hosts:
        try:
            h.log_source(log) if hasattr(h, "log_source") and not need_file else h.log_path(log)
        except InventoryError as exc:
            errors.append(str(exc))
    if errors:
        err = InventoryError(
            "; ".join(errors)
            if len(errors) == 1
            else f"{len(errors)} hosts cannot say which log to read:\n  " + "\n  ".join(errors)
        )
        raise err


def complete_selector(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion for a selector: host and group names (and ``all``) from the inventory that
    ``-i``/``$FLEETDIAG_INVENTORY`` names, for the item after the last ``,`` (``!``/``&`` kept).

    Runs at every Tab press: reads the file quietly, never prints, never raises (no inventory,
    a broken one or anything else: no suggestions)."""
    try:
        from click.shell_completion import CompletionItem

        from ..inventory import find_inventory, load_inventory

        head, comma, item = incomplete.rpartition(",")
        head += comma
        op = item[:1] if item[:1] in ("!", "&") else ""
        word = item[len(op) :]
        given, c = None, ctx  # -i before or after the subcommand
        while c is not None and not given:
            given, c = c.params.get("inventory"), c.parent
        inv = load_inventory(find_inventory(given))
        names = dict.fromkeys(["all", *inv.groups, *inv.hosts])  # file order, once each
        return [CompletionItem(head + op + n) for n in names if n.startswith(word)]
    except Exception:  # noqa: BLE001  (completion must never break the user's shell)
        return []


TEXT_FORMATS = ("text", "json", "jsonl")


def output_options(
    fn: Callable[..., Any] | None = None,
    *,
    formats: tuple[str, ...] = TEXT_FORMATS,
    json_help: str = "One JSON document (schema: README).",
    jsonl_help: str = "One JSON record per host per line, as they finish.",
) -> Any:
    """``--format FORMAT`` and its short forms ``--json`` / ``--jsonl``, the same on every command that
    reports hosts (``formats``: the ones this command can write); two different formats at once is a
    usage error. The command gets ``fmt``: None for the default text, else the format's name."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, fmt_json: bool = False, fmt_jsonl: bool = False, fmt_format: str | None = None, **kw):
            given = [f for f, on in (("json", fmt_json), ("jsonl", fmt_jsonl)) if on]
            if fmt_format:
                given.append(fmt_format)
            if len(set(given)) > 1:
                raise click.UsageError(
                    f"{' and '.join('--' + g for g in dict.fromkeys(given))} are exclusive: choose one"
                )
            fmt = given[0] if given else None
            kw["fmt"] = None if fmt == "text" else fmt
            return fn(*args, **kw)

        wrapper.__click_params__ = list(getattr(fn, "__click_params__", []))  # type: ignore[attr-defined]
        wrapper = click.option(
            "--format",
            "fmt_format",
            type=click.Choice(formats),
            help="Output format [default: text]"
            + "".join(
                note
                for fmt, note in (
                    ("csv", "; csv: the fleet table"),
                    ("md", "; md and html: an incident report to paste"),
                )
                if fmt in formats
            )
            + ".",
        )(wrapper)
        if "jsonl" in formats:
            wrapper = click.option("--jsonl", "fmt_jsonl", is_flag=True, help=jsonl_help)(wrapper)
        if "json" in formats:
            wrapper = click.option("--json", "fmt_json", is_flag=True, help=json_help)(wrapper)
        return wrapper

    return decorate(fn) if fn is not None else decorate


@dataclass
class View:
    """``--only`` / ``--hide`` / ``--summary``: which hosts a report shows, and whether cards are printed."""

    only: set[str] = field(default_factory=set)
    hide: set[str] = field(default_factory=set)
    summary: bool = False

    def keep(self, results: list[Any]) -> list[Any]:
        from ..render import filter_results

        return filter_results(results, self.only, self.hide)

    def note(self, total: int, shown: int) -> str:
        from ..render import filter_note

        return filter_note(total, shown, self.only, self.hide)


def view_options(fn: Callable[..., Any] | None = None, *, summary: bool = True, states: bool = False) -> Any:
    """``--only failed,stalled`` / ``--hide healthy`` (and ``--summary``: the fleet table, no cards), the
    same on probe, sweep and watch. The command gets ``view``; a filter changes what is shown, never
    the exit code."""

    def parse(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> set[str]:
        from ..records import VERDICTS, WatchState
        from ..render import parse_verdicts

        try:
            return parse_verdicts(value, "--" + (param.name or ""), tuple(WatchState) if states else VERDICTS)
        except ValueError as exc:
            raise click.BadParameter(str(exc).split(": ", 1)[1], ctx=ctx, param=param) from None

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, only: set[str], hide: set[str], summary_only: bool = False, **kw: Any) -> Any:
            kw["view"] = View(only=only, hide=hide, summary=summary_only)
            return fn(*args, **kw)

        wrapper.__click_params__ = list(getattr(fn, "__click_params__", []))  # type: ignore[attr-defined]
        if summary:
            wrapper = click.option(
                "--summary", "summary_only", is_flag=True, help="Only the fleet table: no host cards."
            )(wrapper)
        wrapper = click.option(
            "--hide", multiple=True, callback=parse, metavar="VERDICTS", help="Leave out hosts in these verdicts."
        )(wrapper)
        wrapper = click.option(
            "--only",
            multiple=True,
            callback=parse,
            metavar="VERDICTS",
            help="Show only hosts in these verdicts (failed,stalled,degraded,unreachable,no-log,starting,healthy).",
        )(wrapper)
        return wrapper

    return decorate(fn) if fn is not None else decorate


def fanout_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--fanout`` / ``--per-address`` / ``--deadline`` / ``--workers``, the same on every command that
    probes a fleet."""
    from ..ssh.scheduler import DEFAULT_FANOUT, DEFAULT_PER_ADDRESS

    fn = click.option(
        "--workers",
        type=click.IntRange(0),
        default=0,
        envvar="FLEETDIAG_WORKERS",
        help="Processes that probe the hosts [default 0: one per 256 hosts, at most 3 and half the CPUs; "
        "1: this process alone].",
    )(fn)
    fn = click.option(
        "--deadline",
        type=Duration(min_open=True),
        help="Time (90s, 2m, or seconds) one host may take before it counts as unreachable "
        "[default: 2×connect-timeout + timeout + 10].",
    )(fn)
    fn = click.option(
        "--per-address",
        type=click.IntRange(0),
        default=DEFAULT_PER_ADDRESS,
        show_default=True,
        help="Concurrent SSH handshakes per address:port (sshd MaxStartups); 0: no limit.",
    )(fn)
    fn = click.option(
        "--fanout", type=click.IntRange(1), default=DEFAULT_FANOUT, show_default=True, help="Hosts probed at once."
    )(fn)
    return fn


def transport_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """How to reach hosts; the defaults are safe (checked host keys, timeouts on)."""
    options = [
        click.option(
            "--accept-new", is_flag=True, help="Trust an unknown host key on first use (never a changed one)."
        ),
        click.option(
            "--known-hosts",
            type=click.Path(dir_okay=False),
            help="known_hosts file (default: ssh config / ~/.ssh/known_hosts).",
        ),
        click.option("--ssh-config", type=click.Path(dir_okay=False), help="ssh config file (default: ~/.ssh/config)."),
        click.option(
            "--identity",
            multiple=True,
            type=click.Path(dir_okay=False),
            help="Client key file; repeatable (default: agent and ~/.ssh keys).",
        ),
        click.option(
            "--connect-timeout",
            type=DURATION,
            default=f"{CONNECT_TIMEOUT:g}s",
            show_default=True,
            help="Time to connect and log in (10s, 1m, or seconds).",
        ),
        click.option(
            "--timeout",
            "command_timeout",
            type=DURATION,
            default=f"{COMMAND_TIMEOUT:g}s",
            show_default=True,
            help="Time for the remote funnel (2m, 90s, or seconds).",
        ),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def transport_from(kw: dict[str, Any]):
    from ..plan import transport_options

    return transport_options(kw)


PIPE_CLOSED = Exit.PIPE_CLOSED  # (kept for importers; the code lives in exitcodes)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, its result handed back outside the task.

    On Python 3.11 and 3.12 ``asyncio.run`` ends with ``signal.getsignal(SIGINT)``, which builds (and
    drops) the repr of its SIGINT handler, the main task included, and so the task's result: a
    sweep's outcome of 5,000 hosts made a ~90 MB string there, the parent's peak. The task returns
    nothing here, so nothing big is ever repr'd."""
    import asyncio  # here: the CLI's start-up does not need it

    box: list[T] = []

    async def main() -> None:
        box.append(await coro)

    asyncio.run(main())
    return box[0]


def quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush into a closed pipe says nothing."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _user_errors() -> tuple[type[BaseException], ...]:
    """InventoryError and RulesError, from whichever of their modules the command imported: an
    error of a module never imported cannot be raised, so the CLI need not import it to catch it."""
    found: list[type[BaseException]] = []
    for mod, name in (("fleetdiag.inventory.model", "InventoryError"), ("fleetdiag.analysis.rules", "RulesError")):
        cls = getattr(sys.modules.get(mod), name, None)
        if cls is not None:
            found.append(cls)
    return tuple(found)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map fleetdiag's errors to the exit-code contract at one edge."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        env: Output = ctx.find_object(Context).out
        try:
            return fn(*args, **kwargs)
        except _user_errors() as exc:  # the user's input, not our bug
            # as Text, never markup: a selector or value like "[/x]" is data, not a style tag
            env.err.print(Text.assemble(("error: ", "bold red"), env.shown(str(exc))), soft_wrap=True)
            ctx.exit(Exit.USAGE)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except BrokenPipeError:  # `probe all --jsonl | head -1`: the reader is done, so are we, quietly
            quiet_stdout()
            ctx.exit(PIPE_CLOSED)
        except KeyboardInterrupt:
            env.error("interrupted")
            ctx.exit(Exit.INTERRUPTED)
        except Exception as exc:  # a bug: say so, with enough to report it
            env.err.print(Text.assemble(("internal error: ", "bold red"), env.shown(f"{type(exc).__name__}: {exc}")))
            obj = ctx.find_object(Context)
            if (obj is not None and obj.debug) or "--debug" in sys.argv:
                env.err.print_exception()
            else:
                env.err.print(Text("(run again with --debug for the traceback)", style="dim"))
            ctx.exit(Exit.INTERNAL)

    return wrapper


# Each command's module, imported only when that command runs (or for --help): `fleetdiag analyze`
# does not pay for SSH, the scheduler, the store or watch. A module registers its commands on ``main``.
COMMANDS = {
    "analyze": "analyze",
    "demo": "demo",
    "hosts": "hosts",
    "check": "hosts",
    "preflight": "preflight",
    "probe": "probe",
    "sweep": "sweep",
    "history": "sweep",
    "watch": "watch",
    "connections": "connections",
    "completion": "manual",
    "manual": "manual",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use (see ``COMMANDS``)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """An unknown command names the one meant (``prob`` → ``probe``), as an unknown option does."""
        name = click.utils.make_str(args[0]) if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            from difflib import get_close_matches

            near = get_close_matches(name, self.list_commands(ctx), n=2, cutoff=0.6)
            hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
            ctx.fail(f"No such command {name!r}{hint}.")
        return super().resolve_command(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"{__name__}.{COMMANDS[cmd_name]}")
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None and not getattr(cmd, "_global_options", False):
            cmd.params.extend(_global_options())  # every subcommand takes them too (`probe -i inv.yaml gpu01`)
            cmd._global_options = True  # type: ignore[attr-defined]
        return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="fleetdiag")
@click.option(
    "-i",
    "--inventory",
    envvar="FLEETDIAG_INVENTORY",
    help="inventory.yaml (default: $FLEETDIAG_INVENTORY, ./inventory.yaml, ~/.config/fleetdiag/inventory.yaml).",
)
@click.option(
    "--rules",
    "rules",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Extra rules file(s), on top of the shipped rules and ~/.config/fleetdiag/rules.yaml.",
)
@click.option("--color/--no-color", default=None, help="Force colour on or off (NO_COLOR is honoured).")
@click.option(
    "--redact",
    is_flag=True,
    envvar="FLEETDIAG_REDACT",
    help="Replace IPs, host and user names and secret-looking tokens in all output (to share a report).",
)
@click.option("--debug", is_flag=True, help="Show the traceback of an internal error.")
@click.pass_context
def main(
    ctx: click.Context, inventory: str | None, rules: tuple[str, ...], color: bool | None, redact: bool, debug: bool
) -> None:
    """Find the decisive error on every GPU node of a fleet, over SSH.

    \b
    Exit codes: 0 all healthy · 1 a host failed or stalled · 2 usage or inventory error
                3 a host unreachable or without a readable log · 4 internal error · 5 sweep already running
    """
    redactor = None
    if redact:
        from ..redact import Redactor

        redactor = Redactor()
    if ctx.get_parameter_source("inventory") == click.core.ParameterSource.ENVIRONMENT:
        inventory = None  # found (and named in errors) as $FLEETDIAG_INVENTORY, not as -i
    ctx.obj = Context(Output(color=color, redactor=redactor), inventory, rules, debug)


def _set_global(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A global option repeated after the subcommand: it wins over the one before."""
    obj = ctx.find_object(Context)
    if obj is None or value is None or value is False or value == ():
        return value
    if param.name == "inventory":
        obj.inventory_arg = value
    elif param.name == "rules":
        obj.rules_files = tuple(obj.rules_files) + tuple(value)
        obj._rules = None
    elif param.name == "debug":
        obj.debug = True
    elif param.name == "color":
        obj.set_output(color=value)
    elif param.name == "redact":
        obj.set_output(redact=True)
    return value


def _global_options() -> list[click.Option]:
    """-i, --rules, --color/--no-color, --redact, --debug: accepted after the subcommand too."""
    kw: dict[str, Any] = {"expose_value": False, "callback": _set_global, "is_eager": True}
    return [
        click.Option(["-i", "--inventory"], help="inventory.yaml (as before the subcommand).", **kw),
        click.Option(
            ["--rules"],
            multiple=True,
            type=click.Path(exists=True, dir_okay=False),
            help="Extra rules file(s) (as before the subcommand).",
            **kw,
        ),
        click.Option(["--color/--no-color"], default=None, help="Force colour on or off.", **kw),
        click.Option(
            ["--redact"], is_flag=True, default=False, help="Redact names, IPs and secrets in all output.", **kw
        ),
        click.Option(["--debug"], is_flag=True, default=False, help="Show the traceback of an internal error.", **kw),
    ]


def run() -> None:
    """The console entry point: ``main``, then a fast exit.

    By the time ``main`` returns, a command has written its output and closed what it keeps (history,
    reports, the keeper's socket). What is left is the interpreter tearing down its modules and
    objects, ~70 ms of a warm probe: skipped with ``os._exit`` once stdout and stderr are flushed.
    """
    try:
        main()
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    ahead = sys.modules.get("fleetdiag.ssh.keeper.ahead")
    if ahead is not None:  # an early funnel the command never took (it failed first): os._exit skips atexit
        ahead.stop_local()
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): said on stderr, exit 1, as Python does
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader went away first (`| head`): quietly
            code = code or PIPE_CLOSED
        except OSError:
            code = code or Exit.INTERNAL
    os._exit(code)
