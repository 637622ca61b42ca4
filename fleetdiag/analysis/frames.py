"""Which package a traceback's failing frame belongs to, and which package called it.

An ``AttributeError`` or ``ImportError`` raised where one installed package
uses another's API (a trainer calling vLLM, vLLM importing from transformers,
a plugin reading a config object's attribute) says the two installed versions
do not fit; the same error inside one package's own code is a bug of that code.
The message alone cannot tell them apart; the frames can.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .lines import LogLine
from .tracebacks import SECTION, frame_path

_INSTALLED = re.compile(r"[/\\](?:site|dist)-packages[/\\](?P<pkg>[A-Za-z_][A-Za-z0-9_]*)")
# frames that only run an import or forward a call: the frozen import machinery, the stdlib's importlib
_MACHINERY = re.compile(r"^<frozen |[/\\]importlib[/\\]__init__\.py$")
# the message names the other package's module
_NAMED_MODULE = re.compile(
    r"(?:^|[\s'(])module '(?P<a>[A-Za-z_][A-Za-z0-9_.]*)' has no attribute"
    r"|cannot import name '[^']+' from '(?P<b>[A-Za-z_][A-Za-z0-9_.]*)'"
)
# an object's missing attribute; builtin and None types are a caller's own bug, not another package's API
_OBJECT_ATTR = re.compile(r"^'(?P<t>[A-Za-z_][A-Za-z0-9_.]*)' object has no attribute '")
_BUILTIN_TYPES = frozenset(
    "NoneType str int float bool complex list dict tuple set frozenset bytes bytearray function method "
    "builtin_function_or_method type object generator coroutine module property staticmethod classmethod "
    "range slice NotImplementedType ellipsis".split()
)


def frame_lines(block: Sequence[LogLine], upto: int) -> list[str]:
    """The frames of the last traceback section above the line at index ``upto``, outermost first.

    Each is the frame line, then a newline and the source line printed under it when there is one
    (``... in _lazy_init`` / ``queued_call()``), so a rule can name the call a frame was making.
    """
    out: list[str] = []
    for ln in block:
        if ln.index >= upto:
            break
        text = ln.msg.strip()
        if text.startswith(SECTION):
            out = []
        elif frame_path(ln.msg) is not None:
            out.append(text)
        elif out and "\n" not in out[-1] and text and not set(text) <= set("^~ "):
            out[-1] += "\n" + text
    return out


def frame_paths(block: Sequence[LogLine], upto: int) -> list[str]:
    """The file paths of those frames, the import machinery's left out."""
    paths = []
    for text in frame_lines(block, upto):
        p = frame_path(text.split("\n", 1)[0])
        if p and not _MACHINERY.search(p):
            paths.append(p)
    return paths


def installed_package(path: str) -> str | None:
    """The top-level package of a file under site-packages or dist-packages, else None."""
    m = _INSTALLED.search(path)
    return m.group("pkg").removesuffix(".py") if m else None


def _in_tree(path: str, pkg: str) -> bool:
    """Whether a path lies in a package's tree (installed, or a source checkout of it)."""
    norm = path.replace("\\", "/")
    return f"/{pkg}/" in norm or norm.endswith(f"/{pkg}.py")


def _differ(inner: str, outer: str) -> bool:
    a, b = installed_package(inner), installed_package(outer)
    if a and b:
        return a != b
    if a:
        return not _in_tree(outer, a)
    if b:
        return not _in_tree(inner, b)
    return False  # neither is an installed package: a project's own files


def crosses_packages(message: str, paths: Sequence[str]) -> bool:
    """Whether the error was raised where one package used another's API.

    ``message`` is the exception's message (type stripped); ``paths`` the frames, outermost first.
    A module named in the message (``module 'B' has no attribute``, ``cannot import name 'n' from
    'B'``) is another package's when the failing frame is not in B's tree. An object's missing
    attribute is another package's when the failing frame and the frame that called it are in
    different packages, one of them installed.
    """
    if not paths or "circular import" in message or "partially initialized module" in message:
        return False
    m = _NAMED_MODULE.search(message)
    if m is not None:
        top = (m.group("a") or m.group("b") or "").split(".")[0]
        return bool(top) and top != "__main__" and not _in_tree(paths[-1], top)
    m = _OBJECT_ATTR.match(message)
    if m is None or m.group("t").split(".")[-1] in _BUILTIN_TYPES or len(paths) < 2:
        return False
    return _differ(paths[-1], paths[-2])
