"""Finding the inventory file: -i PATH, $FLEETDIAG_INVENTORY, ./inventory.yaml, the user config."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from .model import InventoryNotFound

ENV_VAR = "FLEETDIAG_INVENTORY"
DEFAULT_NAME = "inventory.yaml"


def user_inventory_path() -> Path:
    """The per-user inventory (``~/.config/fleetdiag/inventory.yaml`` on Linux)."""
    return platformdirs.user_config_path("fleetdiag") / DEFAULT_NAME


def find_inventory(explicit: str | None = None) -> Path:
    """Locate the inventory: -i PATH, else $FLEETDIAG_INVENTORY, else ./inventory.yaml, else the user config.

    An explicit path or the variable, when given, must exist: silently
    falling back to another fleet's file would probe the wrong machines.
    """
    if explicit:
        return _must_exist(Path(explicit).expanduser(), "given with -i/--inventory")
    env = os.environ.get(ENV_VAR)
    if env:
        return _must_exist(Path(env).expanduser(), f"from ${ENV_VAR}")
    local = Path(DEFAULT_NAME)
    if local.is_file():
        return local
    user = user_inventory_path()
    if user.is_file():
        return user
    looked = [
        "-i/--inventory (not given)",
        f"${ENV_VAR} (not set)",
        f"./{DEFAULT_NAME} ({Path.cwd() / DEFAULT_NAME})",
        str(user),
    ]
    raise InventoryNotFound(
        "no inventory found; looked at: " + "; ".join(looked) + ". Create one (see docs/inventory.md) or pass -i PATH",
        looked=looked,
    )


def _must_exist(p: Path, how: str) -> Path:
    if p.is_file():
        return p
    why = "is not a file" if p.exists() else "does not exist"
    raise InventoryNotFound(f"inventory {p} ({how}) {why}", looked=[f"{p} ({how})"])
