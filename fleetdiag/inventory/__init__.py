"""The inventory: which hosts exist, how to reach them, where their logs are.

Loaded from ``inventory.yaml`` (native shape: ``defaults``/``hosts``/``groups``)
or from an Ansible inventory (YAML, INI, or ``ansible-inventory --list`` JSON),
so teams need not keep two files. All become the same :class:`Inventory`.

A wrong inventory sends a fleet probe to the wrong place, so validation is
strict: unknown keys are errors (with a close-match suggestion), types are
checked, values that reach ssh must be host names, addresses and user names,
and every error names file, line and dotted key, e.g.
``inventory.yaml:12: hosts.gpu01.prot: unknown key 'prot' (did you mean 'port'?)``.
All errors of a file are collected (``InventoryError.errors``) so
``fleetdiag check`` can list them in one go.

The package: ``model`` (records, errors), ``fields`` (per-key and value
rules), ``native`` and ``ansible`` (the two file shapes), ``selection``
(selectors), ``locate`` (finding the file), ``yamlload`` (YAML with lines).
It knows nothing of click, rich or SSH. See docs/inventory.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..lazy import resolver

if TYPE_CHECKING:
    from .model import Inventory

# Each public name and the module that owns it, imported on first use: a command that needs one record
# (``analyze``'s log source) does not load the Ansible parser and ClusterShell.
_OWNERS = {
    "AnsibleParser": "ansible",
    "ini_to_ymap": "ansible",
    "is_list_json": "ansible",
    "list_json_to_ymap": "ansible",
    "looks_ini": "ansible",
    "JumpHop": "fields",
    "hidden_char": "fields",
    "host_problem": "fields",
    "parse_duration": "fields",
    "parse_jump_hops": "fields",
    "parse_size": "fields",
    "source_problem": "fields",
    "user_problem": "fields",
    "visible": "fields",
    "DEFAULT_NAME": "locate",
    "ENV_VAR": "locate",
    "find_inventory": "locate",
    "user_inventory_path": "locate",
    "ALL": "model",
    "FUNNEL_KEYS": "model",
    "HOST_KEYS": "model",
    "TOP_KEYS": "model",
    "Host": "model",
    "Inventory": "model",
    "InventoryError": "model",
    "InventoryNotFound": "model",
    "LogSource": "model",
    "SelectorError": "model",
    "NativeParser": "native",
    "MAX_RANGE": "selection",
    "fold": "selection",
    "range_size": "selection",
    "select": "selection",
    "select_names": "selection",
    "split_selector": "selection",
    "YMap": "yamlload",
}
_SUBMODULES = ("ansible", "fields", "locate", "model", "native", "selection", "yamlload", "adhoc")


__getattr__ = resolver(__name__, _OWNERS, _SUBMODULES)


__all__ = [
    "ALL",
    "DEFAULT_NAME",
    "ENV_VAR",
    "FUNNEL_KEYS",
    "HOST_KEYS",
    "MAX_RANGE",
    "TOP_KEYS",
    "Host",
    "Inventory",
    "InventoryError",
    "InventoryNotFound",
    "JumpHop",
    "LogSource",
    "SelectorError",
    "find_inventory",
    "fold",
    "hidden_char",
    "host_problem",
    "load_inventory",
    "parse_duration",
    "parse_inventory",
    "parse_jump_hops",
    "parse_size",
    "range_size",
    "select",
    "select_names",
    "source_problem",
    "split_selector",
    "user_inventory_path",
    "user_problem",
    "visible",
]


def load_inventory(path: Path | str) -> Inventory:
    """Read and validate an inventory file (native or Ansible YAML)."""
    from .model import InventoryError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InventoryError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=str(path)) from None
    except OSError as e:
        raise InventoryError(f"cannot read inventory: {e.strerror or e}", path=str(path)) from None
    inv = parse_inventory(text, str(path))
    inv.path = Path(path)
    return inv


def parse_inventory(text: str, path: str = "<string>") -> Inventory:
    """Validate inventory text; ``path`` is only used to name the file in errors."""
    from .ansible import AnsibleParser, ini_to_ymap, is_list_json, list_json_to_ymap, looks_ini
    from .native import NativeParser
    from .yamlload import YMap

    if looks_ini(text):
        ini = AnsibleParser(path)
        data = ini_to_ymap(text, ini.err)
        return _with_warnings(ini.finish(ini.parse(data)), ini)
    reader = NativeParser(path)
    data = reader.load_yaml(text)
    if is_list_json(data):
        lj = AnsibleParser(path)
        lj.errors.extend(reader.errors)
        return _with_warnings(lj.finish(lj.parse(list_json_to_ymap(data))), lj)
    if data is None:
        return reader.finish({})  # raises: the YAML error or "empty"
    reader.check_hidden(data, "")
    if isinstance(data, YMap) and AnsibleParser.is_ansible(data):
        ansible = AnsibleParser(path)
        ansible.errors.extend(reader.errors)
        reader = ansible
    return _with_warnings(reader.finish(reader.parse(data)), reader)


def _with_warnings(inv: Inventory, reader: object) -> Inventory:
    inv.warnings = list(getattr(reader, "warnings", []))
    return inv
