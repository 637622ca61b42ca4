"""The command line: parses, calls the core, renders. Errors become exit codes here."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click
from rich.text import Text

from .. import __version__
from ..exitcodes import Exit
from ..analysis.rules import RulesError
from ..inventory import InventoryError
from ..render import Output


class Context:
    """What every command gets: the one Output it writes through, and the global options."""

    def __init__(self, out: Output, inventory: str | None, rules: tuple[str, ...]):
        self.out = out
        self.inventory_arg = inventory
        self.rules_files = rules
        self._rules = None

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

    def inventory(self):
        from ..inventory import find_inventory, load_inventory

        inv = load_inventory(find_inventory(self.inventory_arg))
        if self.redactor is not None:
            self.redactor.seed_inventory(inv)
        return inv


pass_ctx = click.make_pass_decorator(Context)


def output_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` / ``--jsonl``, the same on every command that reports hosts."""
    fn = click.option("--jsonl", "fmt", flag_value="jsonl", help="One JSON record per host per line, as they finish.")(fn)
    fn = click.option("--json", "fmt", flag_value="json", help="One JSON document (schema: README).")(fn)
    return fn


def fanout_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--fanout`` / ``--per-address`` / ``--deadline``, the same on every command that probes a fleet."""
    from ..scheduler import DEFAULT_FANOUT, DEFAULT_PER_ADDRESS

    fn = click.option("--deadline", type=click.FloatRange(0, min_open=True),
                      help="Seconds one host may take before it counts as unreachable "
                           "[default: 2×connect-timeout + timeout + 10].")(fn)
    fn = click.option("--per-address", type=click.IntRange(0), default=DEFAULT_PER_ADDRESS, show_default=True,
                      help="Concurrent SSH handshakes per address:port (sshd MaxStartups); 0: no limit.")(fn)
    fn = click.option("--fanout", type=click.IntRange(1), default=DEFAULT_FANOUT, show_default=True,
                      help="Hosts probed at once.")(fn)
    return fn


def transport_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """How to reach hosts; the defaults are safe (checked host keys, timeouts on)."""
    options = [
        click.option("--accept-new", is_flag=True, help="Trust an unknown host key on first use (never a changed one)."),
        click.option("--known-hosts", type=click.Path(dir_okay=False), help="known_hosts file (default: ssh config / ~/.ssh/known_hosts)."),
        click.option("--ssh-config", type=click.Path(dir_okay=False), help="ssh config file (default: ~/.ssh/config)."),
        click.option("--identity", "-k", multiple=True, type=click.Path(dir_okay=False), help="Client key file; repeatable (default: agent and ~/.ssh keys)."),
        click.option("--connect-timeout", type=float, default=10.0, show_default=True, help="Seconds to connect and log in."),
        click.option("--timeout", "command_timeout", type=float, default=60.0, show_default=True, help="Seconds for the remote funnel."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def transport_from(kw: dict[str, Any]):
    from ..transport import TransportOptions

    return TransportOptions(
        known_hosts=kw.pop("known_hosts", None),
        accept_new=kw.pop("accept_new", False),
        ssh_config=[kw.pop("ssh_config")] if kw.get("ssh_config") else kw.pop("ssh_config", None),
        client_keys=list(kw.pop("identity", ())) or None,
        connect_timeout=kw.pop("connect_timeout", 10.0),
        command_timeout=kw.pop("command_timeout", 60.0),
    )


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map fleetdiag's errors to the exit-code contract at one edge."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        env: Output = ctx.find_object(Context).out
        try:
            return fn(*args, **kwargs)
        except (InventoryError, RulesError) as exc:  # the user's input, not our bug
            # as Text, never markup: a selector or value like "[/x]" is data, not a style tag
            env.err.print(Text.assemble(("error: ", "bold red"), env.shown(str(exc))), soft_wrap=True)
            ctx.exit(Exit.USAGE)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            env.error("interrupted")
            ctx.exit(130)
        except Exception as exc:  # a bug: say so, with enough to report it
            env.err.print(Text.assemble(("internal error: ", "bold red"), env.shown(f"{type(exc).__name__}: {exc}")))
            if "--debug" in sys.argv:
                raise
            ctx.exit(Exit.INTERNAL)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="fleetdiag")
@click.option("-i", "--inventory", envvar="FLEETDIAG_INVENTORY", help="inventory.yaml (default: $FLEETDIAG_INVENTORY, ./inventory.yaml, ~/.config/fleetdiag/inventory.yaml).")
@click.option("--rules", "rules", multiple=True, type=click.Path(exists=True, dir_okay=False), help="Extra rules file(s), on top of the shipped rules and ~/.config/fleetdiag/rules.yaml.")
@click.option("--color/--no-color", default=None, help="Force colour on or off (NO_COLOR is honoured).")
@click.option("--redact", is_flag=True, envvar="FLEETDIAG_REDACT",
              help="Replace IPs, host and user names and secret-looking tokens in all output (to share a report).")
@click.pass_context
def main(ctx: click.Context, inventory: str | None, rules: tuple[str, ...], color: bool | None, redact: bool) -> None:
    """Find the decisive error on every GPU node of a fleet, over SSH.

    \b
    Exit codes: 0 all healthy · 1 a host failed or stalled · 2 usage or inventory error
                3 a host unreachable or without a readable log · 4 internal error · 5 sweep already running
    """
    redactor = None
    if redact:
        from ..redact import Redactor

        redactor = Redactor()
    ctx.obj = Context(Output(color=color, redactor=redactor), inventory, rules)


from . import analyze as _analyze  # noqa: E402,F401  (registers commands)
from . import demo as _demo  # noqa: E402,F401
from . import hosts as _hosts  # noqa: E402,F401
from . import probe as _probe  # noqa: E402,F401
from . import sweep as _sweep  # noqa: E402,F401
from . import preflight as _preflight  # noqa: E402,F401
from . import watch as _watch  # noqa: E402,F401
from . import connections as _connections  # noqa: E402,F401
