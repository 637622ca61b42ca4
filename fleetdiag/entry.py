"""The console entry point: a warm probe's request leaves before the CLI is imported, then the CLI runs.

Importing the CLI (click's command tree, rich, the inventory, the analysis) takes ~0.3 s; a probe of a
host whose connection the keeper holds spends that waiting for nothing. ``ahead.send_early`` sends the
command line's remembered request first (standard library only; see ``fleetdiag.ssh.keeper.ahead``), so
the host works while the CLI loads, and the CLI takes the answer where it would have sent the request.
``fleetdiag analyze FILE`` likewise starts its funnel's pass over the file first (``ahead.start_local``).
"""

from __future__ import annotations

import sys


def run() -> None:
    """``fleetdiag``: send ahead when this command line can, then ``fleetdiag.cli.run``."""
    from .ssh.keeper import ahead

    ahead.send_early(sys.argv) or ahead.start_local(sys.argv)
    from .cli import run as cli_run

    cli_run()


if __name__ == "__main__":
    run()
