"""What the tests that start the CLI in its own process share: its environment."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli_env(rt: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI process: this checkout importable, no colour, the test's own keeper directory
    ``rt`` and history database beside it, the default ``--persist`` (not the caller's), and a keeper's hello
    waited on for 3 s (a keeper busy with a handshake on a loaded machine still counts as there; the 200 ms
    default is exercised by test_keeper's wedged-keeper test). ``extra`` is set last."""
    env = {
        **os.environ,
        "NO_COLOR": "1",
        "FLEETDIAG_RUNTIME_DIR": str(rt),
        "FLEETDIAG_DB": str(rt.parent / "history.db"),
        "FLEETDIAG_KEEPER_HELLO": "3",
        "PYTHONPATH": str(REPO),
    }
    env.pop("FLEETDIAG_PERSIST", None)
    env.update(extra)
    return env
