"""fleetdiag's import graph: no cycles between modules, and no module importing one of a higher layer.

Read with ``ast`` from the source, function-level imports included (a cycle hidden inside a function
is still a cycle). The layers are docs/architecture.md's "What each folder may import".
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "fleetdiag"

# lowest first; a module may import its own layer and those below (never one above); the longest
# prefix decides (``ssh.reach`` sits low, ``ssh.scheduler`` above the probe)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "records and formats",
        ("records", "units", "timestamps", "exitcodes", "redact", "child", "remote", "delayproxy", "lazy"),
    ),
    (
        "parsing and options",
        ("facts", "inventory", "ssh", "ssh.reach", "ssh.sshfast", "remote.funnel", "remote.follow"),
    ),
    ("one log", ("analysis",)),
    ("below the log", ("evidence", "job.rules")),
    ("across hosts", ("job",)),
    ("connections", ("ssh.transport", "ssh.hostkeys", "ssh.sshconfig", "ssh.trust", "ssh.failures", "ssh.keeper")),
    ("history", ("store", "prometheus")),
    ("one host", ("probe",)),
    ("a fleet", ("ssh.scheduler", "ssh.spread", "plan", "watch", "preflight", "demo")),
    ("sweep", ("sweep",)),
    ("output", ("render",)),
    ("commands", ("cli", "entry")),
]


def modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The fleetdiag modules ``name`` imports anywhere in its source ('' for the package itself)."""
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1] if node.level > 1 else pkg
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("fleetdiag"):
                target = (node.module or "").removeprefix("fleetdiag").lstrip(".")
            else:
                continue
            subs = [f"{target}.{a.name}".lstrip(".") for a in node.names]
            found.update(s for s in subs if s in known)
            if not all(s in known for s in subs) and target in known:
                found.add(target)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fleetdiag."):
                    t = a.name.removeprefix("fleetdiag.")
                    found.update({t} & set(known))
    found.discard(name)
    found.discard("")  # the package root: version only
    return found


def layer_of(name: str) -> int | None:
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            if name == pre or name.startswith(pre + "."):
                if best is None or len(pre) > best[0]:
                    best = (len(pre), i)
    return None if best is None else best[1]


def graph() -> dict[str, set[str]]:
    known = modules()
    return {n: imports(n, p, known) for n, p in known.items() if n}


def test_every_module_has_a_layer_and_imports_only_its_own_or_lower() -> None:
    g = graph()
    assert len(g) > 60  # the walk found the package
    unplaced = sorted(n for n in g if layer_of(n) is None)
    assert not unplaced, f"modules without a layer (add them to LAYERS and docs/architecture.md): {unplaced}"
    upward = sorted(
        f"{n} ({LAYERS[layer_of(n)][0]}) imports {m} ({LAYERS[layer_of(m)][0]})"  # type: ignore[index]
        for n, deps in g.items()
        for m in deps
        if layer_of(m) > layer_of(n)  # type: ignore[operator]
    )
    assert not upward, "\n".join(upward)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk meets (each as the modules on it, first repeated last)."""
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                found.append([*path[path.index(m) :], m])
            elif m not in state:
                visit(m, [*path, m])
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n, [n])
    return found


def test_no_import_cycle_between_modules() -> None:
    g = graph()
    # a package's __init__ re-exporting its own modules is no cycle: its modules never need the package
    edges = {n: {m for m in deps if not (n.startswith(m + ".") and m in g)} for n, deps in g.items()}
    found = cycles(edges)
    assert not found, "\n".join(" -> ".join(c) for c in found)
    assert cycles({"records": {"job"}, "job": {"jobrules"}, "jobrules": {"records"}}) == [
        ["job", "jobrules", "records", "job"]
    ]


def test_the_walk_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    from .b import x\n    from . import c\n")
    known = {"a": tmp_path / "a.py", "b": tmp_path / "b.py", "c": tmp_path / "c.py"}
    assert imports("a", known["a"], known) == {"b", "c"}
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "q.py").write_text("from ..a import f\nfrom fleetdiag.b import y\n")
    known["p.q"] = tmp_path / "p" / "q.py"
    assert imports("p.q", known["p.q"], known) == {"a", "b"}


def test_docs_list_the_same_layers() -> None:
    """docs/architecture.md's "What each folder may import" is this file's LAYERS, row for row."""
    text = (PKG.parent / "docs" / "architecture.md").read_text()
    section = text.split("## What each folder may import", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    documented = [
        (name.strip(), tuple(m.rstrip("/") for m in re.findall(r"`([^`]+)`", mods))) for name, mods in rows[1:]
    ]
    assert documented == [(name, tuple(prefixes)) for name, prefixes in LAYERS]
