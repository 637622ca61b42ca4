"""Rebuild tracebacks per process and turn lines into error events.

Processes write concurrently into one log, so a traceback is rebuilt from
the lines of one *stream*: one process tag plus one logger call site. A
line without any prefix continues the stream of the line before it when it
looks like traceback content, because that is how an unprefixed stderr
traceback follows its tagged opener. Events are the candidates the
classifier later ranks; nothing here decides what matters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .lines import EXC_STANDALONE, FRAME, SEVERITY, LogLine, adjacent
from .rules import CAUSE, CONSEQUENCE, Rules, Signature

TB_START = re.compile(r"Traceback \(most recent call last\):\s*$")
# A frame line: Python's (lines.FRAME: '  File "x.py", line 3, in f'); one whose head a paste cut ('models/llama_kivi.py",
# line 25, in __init__': only at a block's start); pytest's short form ('tests/x.py:14: in f', read by
# analysis/frames.py only). The one definition of a frame: frames.py reads a frame's file through frame_path.
CUT_FRAME = re.compile(r'^(?P<p>[^\s"]+\.py)", line \d+, in \S')
PYTEST_FRAME = re.compile(r"^(?P<p>[^\s:]+\.py):\d+: in \S")
CODE = re.compile(r"^\s+\S")
CARET = re.compile(r"^\s*[\^~]+\s*$")
REPEATED = re.compile(r"^\s*\[Previous line repeated \d+ more times?\]")
CHAIN = re.compile(
    r"^(The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:)\s*$"
)
# how the first line of a traceback section starts (a TB_START or a CHAIN line), for a cheap test
SECTION = ("Traceback", "The above exception", "During handling")
EXC_IN_TB = re.compile(r"^(?P<type>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\([\w.]+\))?)(?:: ?(?P<msg>.*))?$")
TERMINATE = re.compile(
    r"terminate called (?:after throwing an instance of '(?P<type>[^']+)'|without an active exception|recursively)"
)
WHAT = re.compile(r"^\s*what\(\):\s*(?P<msg>.*)$")
# A Rust panic: "thread 'main' panicked at src/main.rs:12:5:" with the message on the next line (Rust 1.73+),
# or "thread 'main' panicked at 'message', src/main.rs:12:5" (older); newer releases put the thread's id after
# its name ("thread 'main' (48213) panicked at"). A paste may wrap it in markdown.
PANIC = re.compile(r"^[*_`]{0,2}thread '(?P<thread>[^']*)' (?:\(\d+\) )?panicked at (?P<rest>.*)$")
NATIVE_STACK = re.compile(r"^(?:Exception raised from .*\(most recent call first\):|frame #\d+:|\s*\d+# |\s+\S)")
UNRAISABLE = re.compile(r"^Exception ignored (?:in|on)\b")
ERROR_WORD = re.compile(r"^(?:ERROR|FATAL|CRITICAL|Error|Fatal error)\b")
# torch's NCCL errors span lines: "...unhandled cuda error" / "ncclUnhandledCudaError: Call to CUDA
# function failed." / "Last error:" / "Cuda failure 'out of memory'". An NCCL result name is never a
# Python class, so such a line is more of the message, not a new exception.
NCCL_RESULT = re.compile(r"^nccl[A-Z]\w*(?:Error|Usage)\b")
# An assertion macro's own report, in any of the forms C/C++ projects print it: ggml's old
# "GGML_ASSERT: file.c:56: expr", its newer "file.c:56: GGML_ASSERT(expr) failed" (cut by a paste
# before the closing "failed" too), a project's "X_ASSERT(expr)" after a file:line.
ASSERT_MACRO = re.compile(r"^(?:\S+:\d+: )?[A-Z][A-Z0-9]*_ASSERT[A-Z0-9_]*(?:: \S+:\d+: \S|\()")

# A JVM's exception report (Java, Scala, Kotlin: Spark, Nextflow's runtime, DJL, DL4J, Ray's Java workers):
# "Exception in thread "main" X: msg" from the uncaught-exception handler, or a logger's "X: msg", with its
# "\tat ..." frames; each cause it wraps follows as "Caused by: Y: msg" with its own frames ("... N more").
# The last "Caused by:" is the innermost cause (the JVM prints the chain outermost first).
JVM_CAUSE = "Caused by: "
JVM_PREFIX = re.compile(r'^(?:Caused by: |Exception in thread "[^"]*" )')

# A traceback's exception line with a paste's prose glued on by full-width punctuation ("AssertionError，每一步…",
# "AssertionError，"): Python never writes those after a type, so the type ends there and the rest is the user's
GLUED_EXC = re.compile(r"^(?P<type>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)[\uff0c\u3002\uff01\uff1f\uff1b\u3001]")


def frame_path(msg: str) -> str | None:
    """The file a frame line names (``FRAME``, ``CUT_FRAME`` or ``PYTEST_FRAME``), or None for any other line."""
    m = FRAME.match(msg) or CUT_FRAME.match(msg) or PYTEST_FRAME.match(msg)
    return m.group("p") if m else None


MAX_CONTINUATION = 100
MAX_FOREIGN = 3


@dataclass(eq=False)
class Event:
    """One error candidate: an exception, a native abort, a signature line or an error-level line."""

    kind: str  # exception | native | signature | error | incomplete
    line: LogLine  # the line that states the error
    process: str | None = None  # the stream's process (an unprefixed line inherits its opener's)
    block: list[LogLine] = field(default_factory=list)  # its whole traceback, header to last line
    exception_type: str | None = None
    message: str = ""  # the error line's message, prefixes peeled
    detail: list[str] = field(default_factory=list)  # continuation lines of the message
    header: str | None = None  # what introduced the traceback ("EngineCore failed to start.")
    header_line: LogLine | None = None  # the line that said it, when it is a line of its own
    signature: Signature | None = None  # the standalone signature that made this line an event
    chain: int = 0  # position in a chain of exceptions (0 = first printed)
    weak: bool = False
    truncated: bool = False  # the traceback's head was not in the lines read
    count: int = 1  # the same line printed again and again by one process counts here
    repeats: list[LogLine] = field(default_factory=list)  # those later copies

    @property
    def text(self) -> str:
        """What rules match against: ``Type: message`` for exceptions."""
        if self.exception_type and self.kind == "exception":
            return f"{self.exception_type}: {self.message}" if self.message else self.exception_type
        if self.exception_type and self.kind == "native" and self.message:
            return f"{self.exception_type}: {self.message}"
        return self.message


_OTHER, _S_TB, _S_FRAME, _S_TERM, _S_EXC, _S_PANIC = range(6)


def _shape(m: str, s: str) -> tuple[int, re.Match[str] | None]:
    """What a message opens, tested once per line (cheap substring checks first)."""
    if "Traceback" in m and TB_START.search(m):
        return _S_TB, None
    if 'File "' in m and FRAME.match(m):
        return _S_FRAME, None
    if '", line ' in m and CUT_FRAME.match(m):
        return _S_FRAME, None
    if "terminate called" in s:
        tm = TERMINATE.search(s)
        if tm:
            return _S_TERM, tm
    if "panicked at " in s:
        pm = PANIC.match(s)
        if pm:
            return _S_PANIC, pm
    em = EXC_STANDALONE.match(s)
    if em:
        return _S_EXC, em
    if ("Caused by: " in s or "Exception in thread" in s) and (jm := JVM_PREFIX.match(s)):
        em = EXC_STANDALONE.match(s[jm.end() :])
        if em:
            return _S_EXC, em
    return _OTHER, None


def _counts_at_info(sig: Signature) -> bool:
    """Whether a line this signature matches is an event though it was logged at INFO or below.

    A native runtime's fatal line stays a cause when a supervisor relays it at INFO level:
    a serving stack that re-logs its workers' stderr ("INFO ... Failed: Cuda error x.cuh:164")
    puts its own level word before the child's words: the level is the relay's, the
    failure is the child's. Only strong causes pass (an exit code does not), and the notes a
    program only ever logs at INFO when it is stuck (role consequence: they lose to any error).
    """
    return not sig.weak and sig.role in (CAUSE, CONSEQUENCE)


def _is_exception_type(name: str) -> bool:
    last = name.split("(", 1)[0].rsplit(".", 1)[-1]
    if not last:
        return False
    if last[0].isupper() or last[0] == "_" and last[1:2].isupper():
        return True
    low = last.lower()
    return any(w in low for w in ("error", "exception", "timeout", "exit", "interrupt"))


_IDLE, _TB, _EXC, _CHAIN, _NATIVE, _CAUSES = range(6)
# Rust's anyhow and eyre print an error returned from main as "Error: <outermost>", a blank line, "Caused by:" and
# each cause it wraps on an indented line of its own, innermost last (numbered "0: …", "1: …" when there are several)
CAUSES_HEAD = "Caused by:"
CAUSE_NUMBER = re.compile(r"^\d+: +")


class _Stream:
    """The lines of one process + call site, fed in file order."""

    __slots__ = (
        "key",
        "rules",
        "out",
        "state",
        "block",
        "chain_events",
        "header",
        "header_line",
        "exc",
        "cont",
        "blank",
        "foreign",
        "last",
        "last_idle",
        "pending",
        "native",
        "truncated",
        "awaiting",
    )

    def __init__(self, key: tuple[str | None, str | None], rules: Rules, out: list[Event]) -> None:
        self.key = key
        self.rules = rules
        self.out = out
        self.state = _IDLE
        self.block: list[LogLine] = []
        self.chain_events: list[Event] = []
        self.header: str | None = None
        self.header_line: LogLine | None = None
        self.exc: Event | None = None
        self.cont = 0
        self.blank = False
        self.foreign = 0
        self.last: LogLine | None = None
        self.last_idle: LogLine | None = None
        self.pending: LogLine | None = None
        self.native: Event | None = None
        self.truncated = False
        self.awaiting = False  # a panic's location line was read: its message is the next line

    # -- does an unprefixed line belong to this stream's open structure? --
    def wants(self, ln: LogLine, prev: LogLine | None) -> bool:
        if ln.process is not None and ln.process != self.key[0]:
            return False
        m = ln.msg
        if self.state == _TB:
            if not m.strip() or FRAME.match(m) or CODE.match(m) or CARET.match(m) or REPEATED.match(m):
                return True
            em = EXC_IN_TB.match(m)
            return bool(em and _is_exception_type(em.group("type")))
        if self.state in (_EXC, _CHAIN):
            return not m.strip() or bool(CHAIN.match(m.strip())) or (self.state == _CHAIN and bool(TB_START.search(m)))
        if self.state == _NATIVE:
            return bool(self.awaiting and m.strip() or WHAT.match(m) or NATIVE_STACK.match(m))
        if self.state == _CAUSES:
            return bool(m[:1].isspace() and m.strip())
        if self.state == _IDLE and TB_START.match(m.strip()) and self.last is not None:
            return self.last is prev and self.last.severity >= SEVERITY["ERROR"] and adjacent(prev, ln)
        return False

    def feed(self, ln: LogLine) -> None:
        self._feed(ln)
        self.last = ln

    def _feed(self, ln: LogLine) -> None:
        m = ln.msg
        s = m.strip()
        shape = _shape(m, s)
        if self.state == _EXC:
            exc = self.exc
            if (
                shape[0] == _S_EXC
                and exc is not None
                and self.cont == 0
                and not self.blank
                and len(self.block) == 1
                and len(self.chain_events) == 1
                and exc.line.msg == m
            ):
                exc.count += 1  # a cascade repeating one line: count it, do not rebuild it
                exc.repeats.append(ln)
                return
            if not s:
                self.blank = True
                return
            if CHAIN.match(s):
                self.block.append(ln)
                self.state = _CHAIN
                return
            if self.blank or not self._continues(ln, s, shape[0]):
                self._close()
            else:
                assert self.exc is not None
                self.exc.detail.append(s)
                self.block.append(ln)
                self.cont += 1
                if self.cont >= MAX_CONTINUATION:
                    self._close()
                return
        elif self.state == _CHAIN:
            if not s:
                return
            if shape[0] == _S_TB:
                self.block.append(ln)
                self.state = _TB
                self.foreign = 0
                return
            self._close()
        elif self.state == _TB:
            if shape[0] == _S_TB:
                self._close()  # the previous one never got its exception line
            elif not s or shape[0] == _S_FRAME or CODE.match(m) or CARET.match(m) or REPEATED.match(m):
                self.block.append(ln)
                self.foreign = 0
                return
            elif shape[0] == _S_EXC and s.startswith(JVM_CAUSE):
                self._close()  # a JVM's next cause after a native stack it quoted: a new exception
            else:
                em = EXC_IN_TB.match(s)
                if em and _is_exception_type(em.group("type")):
                    self._exception(ln, em.group("type"), (em.group("msg") or "").strip())
                    return
                gm = GLUED_EXC.match(s)
                if gm and _is_exception_type(gm.group("type")):
                    self._exception(ln, gm.group("type"), "")
                    return
                self.foreign += 1
                if self.foreign <= MAX_FOREIGN:
                    return  # an interleaved line from elsewhere: skip it
                self._close()
        elif self.state == _NATIVE:
            assert self.native is not None
            if self.awaiting and s:
                self.awaiting = False
                self.native.line = ln  # the panic's message states what failed; its location is the line above
                self.native.message = s
                self.block.append(ln)
                return
            wm = WHAT.match(m)
            if wm:
                self.native.line = ln
                self.native.message = wm.group("msg").strip()
                self.block.append(ln)
                return
            if NATIVE_STACK.match(m) and s:
                self.block.append(ln)
                return
            self._close()
        elif self.state == _CAUSES:
            if s and m[:1].isspace():
                self.block.append(ln)  # one more cause, inside the last
                return
            self._close()
        self._idle(ln, m, s, shape)

    def _continues(self, ln: LogLine, s: str, shape: int) -> bool:
        """Is this line more of the exception's message rather than something new?"""
        if shape != _OTHER and not (shape == _S_EXC and NCCL_RESULT.match(s)):
            return False
        if UNRAISABLE.match(s) or not adjacent(self.last, ln):
            return False
        assert self.exc is not None
        first = self.exc.line
        if ln.headered != first.headered:
            return False  # a new log record, not more of this message
        if first.time is not None and ln.time is not None and ln.time != first.time:
            return False
        if ln.level is not None and first.level is not None and ln.level != first.level:
            return False
        if self.cont == 0 and first.msg.rstrip().endswith(":") and self.exc.message:
            return True  # "... Status Message: " announces the rest of the message on the next line
        sig = self.rules.standalone_for(s)
        return sig is None or sig.weak  # a launcher summary's "exitcode: -9" is part of it

    def _open(self, ln: LogLine, prev: LogLine | None, head: str, truncated: bool) -> None:
        """A traceback starts at ``ln``: its header is the head text before it on the line, else the error line
        ``prev`` right above (which then belongs to the block, not to the pending lines)."""
        if prev is not None and prev is self.pending:
            self.pending = None  # the error line announcing this traceback is its header
        self._flush_pending()
        self.header = head or (prev.msg.strip() if prev is not None else None)
        self.header_line = prev if not head else None
        self.block = ([prev] if prev is not None else []) + [ln]
        self.state, self.foreign, self.truncated = _TB, 0, truncated

    def _idle(self, ln: LogLine, m: str, s: str, shape: tuple[int, re.Match[str] | None]) -> None:
        kind, match = shape
        if kind == _OTHER and s.startswith("--> Returned ") and self._returned(ln, s):
            return
        if s == CAUSES_HEAD and self._opens_causes(ln):
            return
        if kind == _S_TB:
            head = m[: TB_START.search(m).start()].strip()  # type: ignore[union-attr]
            prev = (
                self.last if self.last is not None and self.last is self.last_idle and adjacent(self.last, ln) else None
            )
            self._open(ln, prev, head, truncated=False)
            return
        if kind == _S_FRAME:
            # frames printed without their "Traceback (most recent call last):" head (Ray Serve's request handler
            # logs the stack under its error line; a paste may drop the head): the error line right above is
            # their header, as it is a traceback's
            prev = (
                self.pending
                if self.pending is not None and self.pending is self.last and adjacent(self.last, ln)
                else None
            )
            self._open(ln, prev, "", truncated=True)
            return
        self._flush_pending()
        if kind == _S_TERM:
            tm = match
            assert tm is not None
            self.native = Event("native", ln, self.key[0], exception_type=tm.group("type"), message=s)
            self.block = [ln]
            self.state = _NATIVE
            return
        if kind == _S_PANIC:
            assert match is not None
            self.native = Event("native", ln, self.key[0], message=s)
            self.block = [ln]
            self.state = _NATIVE
            self.awaiting = match.group("rest").rstrip().rstrip("*_`").endswith(":")  # newer form: message follows
            return
        quiet = 0 < ln.severity <= SEVERITY["INFO"]
        em = match if kind == _S_EXC else None
        if em and not quiet and ln.severity != SEVERITY["WARNING"]:
            self.header = self.header_line = None
            self.block = []
            self.truncated = True
            self._exception(ln, em.group("type"), (em.group("msg") or "").strip())
            return
        sig = self.rules.standalone_for(s) if s else None
        if sig is not None and (not quiet or _counts_at_info(sig)):
            self.out.append(Event("signature", ln, self.key[0], block=[ln], message=s, signature=sig, weak=sig.weak))
            self.last_idle = ln
            return
        if sig is None and "ASSERT" in s and ASSERT_MACRO.match(s):
            self.out.append(Event("native", ln, self.key[0], block=[ln], message=s))
            self.last_idle = ln
            return
        if not quiet:
            if (
                s
                and not m[0].isspace()
                and (ln.severity >= SEVERITY["ERROR"] or (ln.level is None and ERROR_WORD.match(s)))
            ):
                self.pending = ln
        self.last_idle = ln

    def _opens_causes(self, ln: LogLine) -> bool:
        """A "Caused by:" under this stream's error line (one blank line between, as anyhow prints it): the causes
        follow, and the innermost, last, states the failure; the outer line only says what was being done."""
        outer = self.pending
        if outer is not None and ln.index - outer.index <= 2:
            self.pending = None
        elif self.out and (ev := self.out[-1]).kind == "error" and ev.process == self.key[0] and ev.weak:
            if ln.index - ev.line.index > 2:
                return False
            outer = self.out.pop().line
        else:
            return False
        self.state, self.block = _CAUSES, [outer, ln]
        return True

    def _returned(self, ln: LogLine, s: str) -> bool:
        """Open MPI's help box: "  orte_ess_init failed" / "  --> Returned value X instead of ORTE_SUCCESS".

        The return-value line says that the line above it names the step that failed, in
        whatever words ("getting local rank failed", "mca_pml_base_open() failed"): that line is
        the event, when a signature knows the return-value line.
        """
        prev = self.last
        if prev is None or prev is not self.last_idle or not adjacent(prev, ln):
            return False
        text = prev.msg.strip()
        if not text or (self.out and self.out[-1].line is prev):
            return False
        sig = self.rules.signature_for(s)
        if sig is None:
            return False
        if self.pending is prev:
            self.pending = None
        self.out.append(
            Event("signature", prev, self.key[0], block=[prev, ln], message=text, detail=[s], signature=sig)
        )
        self.last_idle = ln
        return True

    def _exception(self, ln: LogLine, etype: str, msg: str) -> None:
        ev = Event(
            "exception",
            ln,
            self.key[0],
            exception_type=etype,
            message=msg,
            header=self.header if not self.chain_events else None,
            header_line=self.header_line if not self.chain_events else None,
            chain=len(self.chain_events),
            truncated=self.truncated and not self.chain_events,
        )
        self.block.append(ln)
        self.chain_events.append(ev)
        self.exc = ev
        self.state, self.cont, self.blank = _EXC, 0, False

    def _flush_pending(self) -> None:
        if self.pending is not None:
            p = self.pending
            self.out.append(Event("error", p, self.key[0], block=[p], message=p.msg.strip(), weak=True))
            self.pending = None

    def _close(self) -> None:
        """End the current structure and emit its events."""
        block = self.block
        if self.state == _NATIVE and self.native is not None:
            self.native.block = block
            self.out.append(self.native)
        elif self.state == _CAUSES:
            stated = block[-1] if len(block) > 2 else block[0]  # no cause under the head: the outer line is all
            msg = CAUSE_NUMBER.sub("", stated.msg.strip())
            self.out.append(Event("error", stated, self.key[0], block=block, message=msg, weak=True))
        elif self.state == _TB and not self.chain_events and block and self._stated_by_header():
            # cut before its exception, under a logger's error line that states the failure: that line says it
            hl = self.header_line
            assert hl is not None
            self.out.append(Event("error", hl, self.key[0], block=block, message=hl.msg.strip(), weak=True))
        elif self.state == _TB and not self.chain_events and block and self._stated_on_its_line():
            # cut before its exception, its head on the traceback's own first line stating the failure (vLLM's
            # "Exception in worker … while processing method init_device: <message>, Traceback (most recent …"):
            # that head says it
            self.out.append(Event("error", block[0], self.key[0], block=block, message=self.header or "", weak=True))
        elif self.state == _TB and not self.chain_events and block:
            last = block[-1]
            self.out.append(
                Event(
                    "incomplete",
                    last,
                    self.key[0],
                    block=block,
                    message=last.msg.strip(),
                    header=self.header,
                    header_line=self.header_line,
                    weak=True,
                    truncated=self.truncated,
                )
            )
        for ev in self.chain_events:
            ev.block = block
            self.out.append(ev)
        self.state = _IDLE
        self.block, self.chain_events = [], []
        self.exc = self.native = None
        self.header = self.header_line = None
        self.cont, self.blank, self.foreign, self.truncated = 0, False, 0, False
        self.awaiting = False
        self.last_idle = None

    def _stated_by_header(self) -> bool:
        """A traceback without its final line whose header is an error-level logger line with a message of its
        own (Xinference's "<time> <logger> <pid> ERROR    <what failed>"): the header is the statement left."""
        hl = self.header_line
        return hl is not None and hl.severity >= SEVERITY["ERROR"] and len(hl.msg.strip()) >= 8

    def _stated_on_its_line(self) -> bool:
        """A traceback without its final line opened on an error-level line whose head before "Traceback (most
        recent call last):" is a message of its own (a head on the line itself leaves no header line)."""
        return (
            self.header_line is None
            and self.block[0].severity >= SEVERITY["ERROR"]
            and len((self.header or "").strip(" ,:")) >= 8
        )

    def finish(self) -> None:
        if self.state != _IDLE:
            self._close()
        self._flush_pending()


def build_events(lines: list[LogLine], rules: Rules) -> list[Event]:
    """All error events of the given lines, in file order."""
    out: list[Event] = []
    streams: dict[tuple[str | None, str | None], _Stream] = {}
    prev_stream: _Stream | None = None
    prev: LogLine | None = None
    for ln in lines:
        key = (ln.process, ln.source)
        if not ln.headered and prev_stream is not None and prev_stream.key != key and prev_stream.wants(ln, prev):
            key = prev_stream.key
        st = streams.get(key)
        if st is None:
            st = streams[key] = _Stream(key, rules, out)
        st.feed(ln)
        prev_stream, prev = st, ln
    for st in streams.values():
        st.finish()
    if any(out[k].line.index > out[k + 1].line.index for k in range(len(out) - 1)):
        out.sort(key=lambda e: (e.line.index, e.chain))
    return out
