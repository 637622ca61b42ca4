"""The Xid table: shipped data, merged with a user's file of the same shape."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built: ~5x faster

ACTIONS = ("hardware", "driver", "application", "informational")


class XidTableError(ValueError):
    """An Xid file is unreadable or invalid; the message names the file and the code."""


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    meaning: str
    action: str  # hardware | driver | application | informational
    category: str  # what a card says when this Xid is chosen: hardware | driver | application
    hint: str
    # a channel's event that an application fault on the same GPU brings about (Xid 109 after Xid 13): then
    # that fault's aftermath, not a fault of its own
    aftermath: bool = False


@dataclass(frozen=True)
class XidTable:
    codes: dict[int, XidInfo]
    hints: dict[str, str]

    def get(self, code: int | None) -> XidInfo:
        """The entry for ``code``; an unknown code is treated as a driver event so it is never silently benign."""
        if code is not None and code in self.codes:
            return self.codes[code]
        return XidInfo(
            code or 0,
            "Unknown Xid",
            "an Xid this table does not describe",
            "driver",
            "driver",
            self.hints.get("driver", "reset the GPU"),
        )


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER) or {}  # noqa: S506 (a safe loader)
    except (OSError, yaml.YAMLError) as exc:
        raise XidTableError(f"{path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("xids", {}), dict):
        raise XidTableError(f"{path}: expected a mapping with an 'xids' mapping")
    return data


def _merge(raw: dict[int, dict[str, Any]], hints: dict[str, str], data: dict[str, Any], path: Path) -> None:
    for key, entry in (data.get("xids") or {}).items():
        try:
            code = int(key)
        except (TypeError, ValueError) as exc:
            raise XidTableError(f"{path}: xids.{key}: the key must be an Xid number") from exc
        if not isinstance(entry, dict):
            raise XidTableError(f"{path}: xids.{key}: expected a mapping")
        merged = {**raw.get(code, {}), **entry}
        if merged.get("action") not in ACTIONS:
            raise XidTableError(f"{path}: xids.{key}.action: one of {', '.join(ACTIONS)}")
        raw[code] = merged
    for k, v in (data.get("hints") or {}).items():
        hints[str(k)] = str(v)


def shipped_path() -> Path:
    return Path(str(resources.files("fleetdiag") / "data" / "xid.yaml"))


def load_xid_table(*user_files: str | Path) -> XidTable:
    """The shipped table with each user file merged over it (later files win, field by field)."""
    raw: dict[int, dict[str, Any]] = {}
    hints: dict[str, str] = {}
    for p in (shipped_path(), *map(Path, user_files)):
        _merge(raw, hints, _read(p), p)
    codes = {}
    for code, e in raw.items():
        action = e["action"]
        category = str(e.get("category") or (action if action != "informational" else "driver"))
        codes[code] = XidInfo(
            code,
            str(e.get("name", f"Xid {code}")),
            str(e.get("meaning", "")),
            action,
            category,
            str(e.get("hint") or hints.get(action, "")),
            bool(e.get("aftermath", False)),
        )
    return XidTable(codes, hints)


@lru_cache(maxsize=1)
def default_xid_table() -> XidTable:
    return load_xid_table()
