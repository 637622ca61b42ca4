"""The one output edge: every byte a command writes passes ``Output`` (``--redact``, control characters
from hosts made visible, once)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from rich.console import Console
from rich.markup import escape as rich_escape
from rich.segment import Segment
from rich.text import Text

from ..records import (
    SCHEMA_VERSION,
    HostResult,
)

# --------------------------------------------------------------------------- the output edge

# Every C0 control but newline and tab, DEL, every C1 control, and the bidi
# embedding/override/isolate marks: shown as escapes (``\x1b``, ``\u202e``),
# never passed to a terminal. One str.translate pass with a total table: the
# replacement text is printable ASCII, so nothing can re-form a sequence.
_INVISIBLE = [
    *range(0x00, 0x09),
    *range(0x0B, 0x20),
    *range(0x7F, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_VISIBLE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _INVISIBLE}
_VISIBLE_ONE_LINE = {**_VISIBLE, 0x0A: "\\n", 0x09: "\\t"}


def visible(text: str, one_line: bool = False) -> str:
    """``text`` safe for a terminal: control and bidi characters made visible (``\\x1b``)."""
    return text.translate(_VISIBLE_ONE_LINE if one_line else _VISIBLE)


def visible_obj(o: Any, _inside: bool = False) -> Any:
    """A copy of a record (dataclass, dict, list, str) with every string passed through ``visible``.

    Inside a record a string is one value (a host name, a file name discovery found, a log line, a
    reason): its newlines and tabs are shown escaped too, so ``x.log\nERROR injected`` can never
    start a row of its own on a card. A bare string keeps its lines."""
    if isinstance(o, str):
        return visible(o, one_line=_inside)
    if isinstance(o, dict):
        return {(visible(k, True) if isinstance(k, str) else k): visible_obj(v, True) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        items = [visible_obj(v, True) for v in o]
        return type(o)(items) if isinstance(o, tuple) and not hasattr(o, "_fields") else items
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        new = copy.copy(o)
        for f in dataclasses.fields(o):
            try:
                object.__setattr__(new, f.name, visible_obj(getattr(o, f.name), True))
            except (AttributeError, TypeError):
                pass
        return new
    return o


class SafeConsole(Console):
    """A rich Console that never interprets data: no markup or emoji codes unless asked
    for, and every segment of text (not rich's own control codes) made visible on its
    way to the file, so no byte from a host can reach the terminal as a control."""

    def __init__(self, **kw: Any) -> None:
        self.show_data: Any = visible_obj  # how host data is shown here (the Output sets its redacting version)
        kw.setdefault("markup", False)
        kw.setdefault("emoji", False)
        kw.setdefault("highlight", False)
        super().__init__(**kw)

    def on_broken_pipe(self) -> None:
        """A closed stdout (``| head``): let the command end quietly, where it decides (rich would exit 1)."""
        self.quiet = True
        raise BrokenPipeError(32, "Broken pipe")

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(visible(seg.text), seg.style, None) for seg in buffer
        )


@dataclass
class Output:
    """Where every command writes, and how (httpie's Environment idea).

    Holds stdout and stderr consoles, whether stdout is a terminal, colour,
    width, the output format and the ``--redact`` redactor. Commands pass
    records through ``shown`` (text formats: redacted and made visible) or
    write JSON with ``json``/``jsonl`` (redacted, raw text escaped by JSON),
    so ``--redact`` and the terminal neutraliser are applied here, once.
    """

    stdout: IO[str] | None = None
    stderr: IO[str] | None = None
    color: bool | None = None
    width: int | None = None
    redactor: Any = None  # a fleetdiag.redact.Redactor under --redact
    format: str | None = None  # None (cards/tables) | json | jsonl
    out: Console = field(init=False)
    err: Console = field(init=False)

    def __post_init__(self) -> None:
        no_color = bool(os.environ.get("NO_COLOR")) or self.color is False
        self.out = SafeConsole(
            file=self.stdout,
            no_color=no_color,
            width=self.width,
            force_terminal=True if self.color else None,
            soft_wrap=False,
        )
        self.err = SafeConsole(file=self.stderr, stderr=self.stderr is None, no_color=no_color, width=self.width)
        # Off a terminal (a log file, cron mail, `2>&1 | grep`) a message is one line: never hard-wrapped at 80.
        self.err.soft_wrap = not self.err.is_terminal
        self.out.show_data = self.err.show_data = self.shown  # live views (progress, watch) redact through the console

    @property
    def is_tty(self) -> bool:
        return self.out.is_terminal

    # ------------------------------------------------------------ data on its way out

    def redacted(self, o: Any) -> Any:
        """``o`` as it may be shown: a redacted copy under --redact (the original stays real)."""
        if self.redactor is None:
            return o
        if isinstance(o, str):
            return self.redactor.text(o)
        if isinstance(o, HostResult):
            return self.redactor.result(o)
        return self.redactor.obj(o)

    def shown(self, o: Any) -> Any:
        """``o`` for a card or table: redacted, and every string made visible."""
        return visible_obj(self.redacted(o))

    # ------------------------------------------------------------ writing

    def print(self, *objects: Any, **kw: Any) -> None:
        """Print renderables on stdout; a plain string is data (redacted, no markup)."""
        self.out.print(*(self.shown(o) if isinstance(o, str) else o for o in objects), **kw)

    def error(self, *objects: Any, **kw: Any) -> None:
        """Print on stderr; a plain string is data (redacted, no markup)."""
        self.err.print(*(self.shown(o) if isinstance(o, str) else o for o in objects), **kw)

    def markup(self, template: str, *values: Any) -> Text:
        """Markup written by fleetdiag with data filled in as literal, redacted text."""
        return Text.from_markup(template.format(*(rich_escape(str(self.shown(str(v)))) for v in values)))

    def json(self, doc: Any, indent: int | None = 2) -> None:
        """One JSON document on stdout (redacted; control characters escaped by JSON)."""
        self._write(json.dumps(self.redacted(doc), indent=indent) + "\n")

    def jsonl(self, doc: Any) -> None:
        """One JSON line on stdout, flushed (for a pipe reading as it comes); every record names its schema version."""
        if isinstance(doc, dict) and "version" not in doc:
            doc = {"version": SCHEMA_VERSION, **doc}
        self.json(doc, indent=None)

    def document(self, text: str) -> None:
        """A whole document fleetdiag built (csv, Markdown, HTML) from records already ``shown``: written
        as it is, with any control character still in it made visible."""
        self._write(visible(text))

    def _write(self, text: str) -> None:
        f = self.stdout or sys.stdout
        f.write(text)
        f.flush()


Env = Output  # the older name
