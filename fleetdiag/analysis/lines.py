"""The line model: one raw log line → process tags, level, time, source, message.

Multi-process logs stack prefixes (docker-compose service, Ray's actor tag,
vLLM's process tag, torchrun's ``[rank3]:``, a logger header, an NCCL
``host:pid:tid [dev]``...). Peeling them in a loop, whatever their order,
lets every later step work on the message alone and group lines by the
process that wrote them.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ..records import Line
from ..timestamps import MONTH_WORD

MAX_PARSE = 16384  # characters of a line that are parsed; the raw line is kept whole

SEVERITY = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
_LEVEL_ALIASES = {
    "WARN": "WARNING",
    "FATAL": "CRITICAL",
    "TRACE": "DEBUG",
    "SUCCESS": "INFO",
    "I": "INFO",
    "W": "WARNING",
    "E": "ERROR",
    "F": "CRITICAL",
    "D": "DEBUG",
    "FAILED": "ERROR",  # pytest's short test summary
    # logfmt's words (Go's slog and logrus, go-kit's "level=error", log15's "lvl=eror")
    "ERR": "ERROR",
    "EROR": "ERROR",
    "CRIT": "CRITICAL",
    "PANIC": "CRITICAL",
    "DBUG": "DEBUG",
}

# Progress of a training/fine-tuning loop: "step 120", "global_step=5", "iteration 40/1000", "Epoch 3",
# "[rank0] step 8 norm", Megatron's " iteration      100/ 1000 |", HF Trainer's "{'loss': 0.52, ...}".
PROGRESS = re.compile(
    r"(?:\b(?:global[_ ]?)?step\b\s*[:=#]?\s*\[?\d+(?!\d*\s*:\s*[A-Z])"  # not a script's "Step 1: Launching"
    r"|\biter(?:ation)?s?\b\s*[:=#]?\s*\[?\d+"
    r"|\bepoch\b\s*[:=#]?\s*\[?\d+(?!\d*\s*:\s*[A-Z])"
    r"|['\"]?\bloss['\"]?\s*[:=]\s*[-\d.]+(?:e-?\d+)?\b(?!.*\bHTTP\b)"
    r"|\btrain(?:ing)?[_ ]loss\b)",
    re.IGNORECASE,
)

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_LVL = r"DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL"
_SRC = r"[\w./<>-]+:\d+"


def _p(rx: str) -> re.Pattern[str]:
    return re.compile(rx)


# Each peeler matches at the start of what is left of the line. Named groups:
# tag (a process tag), level, time, source (logger file:line or name).
_PAREN_TAG = _p(r"\((?P<tag>(?:[A-Za-z_][\w.:-]*(?: [\w=.-]+)*,? )?pid=\d+(?:, ip=[\w.:]+)?)\) ?")
_RAY_SYS = _p(r"\((?P<tag>(?:raylet|gcs_server|autoscaler|monitor|dashboard)(?:, ip=[\w.:]+)?)\) ?")
_RAY_SYS_TAGS = frozenset(("raylet", "gcs_server", "autoscaler", "monitor", "dashboard"))
_ASCEND_PID = _p(r"\(PID: *\d+(?:, *Device: *-?\d+)?(?:, *RankID: *-?\d+)?\) *")
_BRACKET_TIME = _p(
    r"\[(?P<time>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)"
    r"(?: (?P<tag>[A-Z]{1,4}\d+(?: [A-Z]{1,4}\d+)*))?\] ?"
)
# a launcher's label for the process that wrote the line, in brackets before a colon: torchrun's and
# accelerate's "[rank3]:" / "[default0]:", TorchX's replica and rank "[trainer22|6]:" (a role's name, then
# its replica and rank numbers). The label is the line's process tag
_RANK = _p(r"\[(?P<tag>(?:rank|default)\d+|[A-Za-z][\w.-]{0,40}\|\d{1,6})\]: ?")
_MPI = _p(r"\[(?P<tag>\d+,\d+)\]<std(?:out|err)>: ?")
_GLOG_BR = _p(r"\[(?P<level>[IWEF])(?P<time>\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?)(?: \d+)? (?P<source>" + _SRC + r")\] ?")
_GLOG_BR_OLD = _p(r"\[(?P<level>[IWEF]) (?P<source>" + _SRC + r")\] ?")
_BRACKET_LEVEL = _p(r"\[(?P<level>" + _LVL + r")\] *")
# a launcher's or desktop front-end's own level and component before the line it relays, in title case:
# "2026-05-08 11:42:09.093 [Error] (Process) ..." (the component is peeled as the line's process tag). A
# relay writes a child's every line at Info whatever it says, so only Warn and above count as the line's level
_BRACKET_LEVEL_TITLE = _p(r"\[(?P<relay>Debug|Info|Notice|Warn|Warning|Error|Critical|Fatal|Trace)\] *")
_RELAY_LEVEL = {"Warn": "WARNING", "Warning": "WARNING", "Error": "ERROR", "Critical": "CRITICAL", "Fatal": "CRITICAL"}
_PAREN_COMPONENT = _p(r"\((?P<tag>[A-Za-z][\w.-]{0,39})\) ?")
# Python logging's "%(asctime)s %(name)s %(process)d %(levelname)s" (Xinference's and other servers'):
# "2024-01-18 21:27:53,300 xinference.core.model 35043 ERROR    Model actor is out of memory."
_LOGGER_PID_LEVEL = _p(r"(?P<source>[A-Za-z_][\w.]{0,80}) \d{1,7} (?P<level>" + _LVL + r")(?: +|$)")
# TensorRT-LLM's "[06/21/2025-01:30:42] "
_BRACKET_TIME_MDY = _p(r"\[(?P<time>\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d(?:\.\d+)?)\] ?")
# a native library's own prefix: "[TensorRT-LLM][ERROR] ", "[TRT-LLM] [RANK 0] [E] "
_BRACKET_NAME_LEVEL = _p(
    r"\[(?P<source>[A-Za-z][\w.+-]*)\] ?(?:\[RANK \d+\] )?\[(?P<level>" + _LVL + r"|TRACE|[EWIF])\] ?"
)
_BRACKET_SOURCE = _p(r"\[(?P<source>[\w./<>-]+\.py:\d+(?::[\w<>.]+)?)\] ?")
# TensorRT's own loggers (trtexec, polygraphy) after their "[05/21/2024-16:18:49] ": "[E] ", "[W] ", "[I] "
_BRACKET_LETTER = _p(r"\[(?P<level>[EWIF])\] ")
# ComfyUI-Manager relays a child process's stderr (git, pip, an install script) with "[!] " before each line
_BRACKET_BANG = _p(r"\[!\](?: |$)")
# a front end's or a pipeline's label for the component whose line it relays ("[ACE-Step] ", vllm-omni's
# "[Stage-1] "): one capitalised word, no blank, before the line; the label is the line's process tag. Tried after
# every other bracketed form (a level, a time, a rank, a library's "[TensorRT-LLM][ERROR]")
_BRACKET_LABEL = _p(r"\[(?P<tag>[A-Z][A-Za-z0-9_.-]{1,39})\] (?=\S)")
# the two dates a program's own header carries after its level word: a full date, its zone or not, and vLLM's
# month-day time. normalise asks for them too, to tell a program's header from a collector's severity column
ISO_DATE = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
MONTH_DAY_TIME = r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?"
_ISO_TIME = _p(r"(?P<time>" + ISO_DATE + r")[ \t]+(?=\S)")
# Python logging's level word beside a full date, either side: "%(levelname)s %(asctime)s" (Ray Serve's
# "ERROR 2024-09-19 08:23:55,732 controller 528 -- ..."), and "%(asctime)s %(levelname)s" ("2026-08-07T18:25:43.623Z
# ERROR xinference.core.worker pid:41 ..."; only right after the time, where a level word is the header's)
_LEVEL_ISO = _p(r"(?P<level>" + _LVL + r") +(?P<time>" + ISO_DATE + r") +(?=\S)")
_LEVEL_WORD = _p(r"(?P<level>" + _LVL + r") +(?=\S)")
_ASCEND_TIME = _p(r"(?P<time>\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d(?:\.\d+)*) +")
# Intel oneCCL's own log header: "2024:08:21-10:24:26:( 4456) |CCL_ERROR| file.cpp:867 func: message" (its time, the
# process id it names the process by, its level). The "|CCL_ERROR| " stays on the message: it names the library
_ONECCL = _p(
    r"(?P<time>\d{4}:\d\d:\d\d-\d\d:\d\d:\d\d):\( *(?P<tag>\d{1,7})\) "
    r"(?=\|CCL_(?P<level>ERROR|WARN|INFO|DEBUG|TRACE|FATAL)\| )"
)
# nccl-tests name the host before their failure lines: "node7: Test NCCL failure common.cu:959 '...'"
_NCCL_TESTS = _p(r"(?P<tag>[A-Za-z0-9][\w.-]*): (?=Test (?:NCCL|CUDA) failure )")
# llama.cpp's common log: "0.00.160.791 I cmn  message" (time since start, one-letter level; a line
# printed without a level keeps the stamp alone), after the pid a server names its process by: "[46009] "
_GGML_LOG = _p(r"(?P<time>\d+\.\d\d\.\d\d\d\.\d\d\d) (?:(?P<level>[IWEFD]) +)?")
_BRACKET_PID = _p(r"\[(?P<tag>\d{2,7})\] (?=\d+\.\d\d\.\d\d\d\.\d\d\d )")
# after a time: a journald/snap "unit[pid]: " (short-iso without the host, or with it)
_UNIT_PID = _p(r"(?:[a-z0-9][\w.-]* )?(?P<tag>[A-Za-z][\w.@/-]*\[\d+\]): ")
_UNIT_PID_START = _p(r"(?P<tag>[A-Za-z][\w.@/-]*\[\d+\]): ")
_NCCL = _p(r"(?P<tag>[A-Za-z0-9][\w.-]*:\d+:\d+ \[\d+\]) ")
_VLLM = _p(r"(?P<level>" + _LVL + r") +(?P<time>" + MONTH_DAY_TIME + r") +\[?(?P<source>" + _SRC + r")\] ?")
_GLOG = _p(r"(?P<level>[IWEF])(?P<time>\d{4} \d\d:\d\d:\d\d\.\d+) +\d+ (?P<source>" + _SRC + r")\] ")
_PYLOG = _p(r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<source>[\w.]+):")
_UVICORN = _p(r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL): +")
_LEVEL_SRC = _p(r"(?P<level>" + _LVL + r") +\[(?P<source>" + _SRC + r")\] ?")
_RAY = _p(r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) +(?P<source>[\w./<>-]+\.py:\d+) -- ")
_PYDASH = _p(r"- (?P<source>[\w.]+) - (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) - ")
_LOGURU = _p(r"\| (?P<level>TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR|CRITICAL) *\| (?P<source>[\w.<>:-]+) - ")
# FastChat's (and LLaVA's) "<time> | LEVEL | logger | message"; its stream logger relays what the program wrote to
# stderr as "| ERROR | stderr | <line>", whatever the line says: the line's own words decide, not that level
_PIPE_LOGGER = _p(r"\| (?P<level>TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR|CRITICAL) +\| (?P<source>[\w.<>:-]+) \|(?: |$)")
_RELAYED_STREAMS = ("stderr", "stdout")
_COMPOSE = _p(r"(?P<tag>[A-Za-z0-9][\w.-]*) +\| ")
# a runner that relays each node's or each job's streams puts the name and the stream before every line:
# "dinov2-giant-nodes.cn-d004 [stderr] " (milabench), "host [stdout] "; the name is the line's process tag
_STREAM_COL = _p(r"(?P<tag>[A-Za-z0-9][\w.-]*) \[(?:stdout|stderr)\] ?")
# pdsh / clush / DeepSpeed's multi-node runner put "host: " before every line.
# A host name is lower-case labels with a digit or hyphen somewhere (an
# exception type is CamelCase or dotted, "error: " has neither). The toolchain's programs that
# name themselves before their diagnostics look like hosts ("cc1plus: fatal error: ...", "collect2: ",
# "gcc-12: error: "): they are the line's words, not a prefix.
_PDSH = _p(
    r"(?!(?:cc1(?:plus|obj)?|collect2|(?:gcc|cc|cpp|clang|lto|ld)-[0-9][0-9.]*): )"
    r"(?P<tag>(?=[a-z0-9.-]*[0-9-])[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*): (?=\S|$)"
)
# Ray's C++ components: "[2025-04-02 15:02:00,117 E 135782 135782] (raylet) node_manager.cc:3069: "
_RAY_CPP = _p(r"\[(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?) (?P<level>[IWEF]) \d+ \d+\] ?")
_RAY_CPP_SRC = _p(r"(?P<source>[\w./-]+\.(?:cc|cpp|h|hpp):\d+): ")

# containerd/CRI log files (/var/log/pods): "2024-01-01T00:00:00.000000000Z stderr F message"
_CRI = _p(r"(?:stdout|stderr) [FP] ")
# a logfmt record's header (Go's slog and logrus text handlers, ollama's server; go-kit's "level=error ts=…
# caller=…"): its time, level and source keys, in either order, before the record's msg="…" and its other keys
_LOGFMT_VAL = r'(?:"[^"]{0,80}"|[^\s"]{1,80})'
_LOGFMT = _p(
    r"(?:(?:time|ts|t)=(?P<time>" + _LOGFMT_VAL + r") +)?"
    r'(?:level|lvl)="?(?P<level>(?i:debug|info|warn|warning|error|err|eror|fatal|panic|crit|critical|trace|dbug))"?'
    r"(?= )(?: +(?:(?:time|ts|t)="
    + _LOGFMT_VAL
    + r"|(?:source|caller|logger|component)=(?P<source>"
    + _LOGFMT_VAL
    + r")))* +"
)
# syslog / journald: "Jan  2 03:04:05 host vllm[1234]: message" (journalctl -o short-precise: 03:04:05.123456;
# a journal without a host name leaves two blanks: "Apr 27 09:35:17  lemond[17105]: "); journalctl prints the
# month as the reader's locale abbreviates it ("ago 27", "2月 25"): timestamps.MONTH_WORD
_SYSLOG = _p(
    r"(?P<time>" + MONTH_WORD + r" [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?) (?:\S+ | )"
    r"(?P<tag>[\w.@/-]+\[\d+\]): "
)

# pytest's short test summary: "FAILED <test id> - <the exception it failed with>" ("ERROR …" for a test that failed
# in its set-up), with its duration when -v asks for it: a failed test is an error, its exception the message (a
# wrapper there, EngineDeadError, stays a wrapper)
_PYTEST_SUMMARY = _p(r"(?P<level>FAILED|ERROR) (?:\[[\d.]+m?s\] )?(?P<source>[^\s:]+\.py::\S+) - (?=\S)")
_UPPER = (
    _PYTEST_SUMMARY,
    _VLLM,
    _GLOG,
    _PYLOG,
    _UVICORN,
    _LEVEL_SRC,
    _RAY,
    _LEVEL_ISO,
    _SYSLOG,
    _NCCL,
    _LOGGER_PID_LEVEL,
)
_DISPATCH: dict[str, tuple[re.Pattern[str], ...]] = {
    "(": (_PAREN_TAG, _RAY_SYS, _ASCEND_PID),
    "[": (
        _BRACKET_TIME,
        _BRACKET_TIME_MDY,
        _RAY_CPP,
        _RANK,
        _MPI,
        _GLOG_BR,
        _GLOG_BR_OLD,
        _BRACKET_LEVEL,
        _BRACKET_LEVEL_TITLE,
        _BRACKET_SOURCE,
        _BRACKET_NAME_LEVEL,
        _BRACKET_PID,
        _BRACKET_LETTER,
        _BRACKET_BANG,
        _BRACKET_LABEL,
    ),
    "-": (_PYDASH,),
    "|": (_LOGURU, _PIPE_LOGGER),
}
for _c in "0123456789":
    _DISPATCH[_c] = (_ISO_TIME, _ASCEND_TIME, _ONECCL, _GGML_LOG, _NCCL, _SYSLOG)
for _c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
    _DISPATCH[_c] = _UPPER
for _c in "abcdefghijklmnopqrstuvwxyz":
    _DISPATCH[_c] = (_NCCL, _LOGGER_PID_LEVEL, _SYSLOG)
_DISPATCH["s"] = (_CRI, _NCCL, _LOGGER_PID_LEVEL, _SYSLOG)
_DISPATCH["t"] = (_LOGFMT, *_DISPATCH["t"])
_DISPATCH["l"] = (_LOGFMT, *_DISPATCH["l"])
_OTHER_SCRIPT = (_SYSLOG,)  # a line opening in another script: a journal's month under the reader's locale

_GROUPS = {
    rx: tuple(n for n in ("tag", "level", "time", "source") if n in rx.groupindex)
    for rx in (
        _COMPOSE,
        _STREAM_COL,
        _PDSH,
        _NCCL_TESTS,
        _RAY_CPP_SRC,
        _UNIT_PID,
        _UNIT_PID_START,
        _PAREN_COMPONENT,
        _LEVEL_WORD,
        *{r for v in _DISPATCH.values() for r in v},
    )
}
# Terminal UIs (k9s, less with borders, rich panels) frame each line: "│ text   │".
_FRAMES = "│┃║"


def unframe(s: str) -> str:
    """The line inside a terminal UI's frame: the opening frame and one blank after it, then trailing blanks, a
    closing frame and the blanks before it. By string operations: a regex of a lazy group and two blank runs
    backtracked in cubic time on a long run of blanks."""
    if not s or s[0] not in _FRAMES:
        return s
    body = s[2:] if s[1:2].isspace() else s[1:]
    if "\n" in body:  # a regex's "." stops at a newline: such a text was never one framed line
        return s
    body = body.rstrip()
    if body and body[-1] in _FRAMES:
        body = body[:-1].rstrip()
    return body


# Colour codes whose ESC byte was lost in a copy-paste ("[1;36m(VllmWorker pid=1)[0;0m",
# "^[[0m", "#033[0m", "\ufffd[0m"), and a carriage return shown as "^M".
_ANSI_LOST = re.compile(
    r"(?:\^\[|#033|\\033|\\x1[bB]|\\e|\ufffd)\[[0-9;]*m"
    r"|^\[(?:[0-9]{1,3};)*[0-9]{1,3}m|\[(?:[0-9]{1,3};)*[0-9]{1,3}m(?=\()|(?<=\))\[(?:[0-9]{1,3};)*[0-9]{1,3}m"
    r"|\^M$"
)
_ANSI_GATE = re.compile(r"\[[0-9;]{1,12}m")  # cheap test first: most lines have none
# Ray deduplicates identical lines across workers and appends a count.
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_NCCL_LEVEL = re.compile(r"(?:^|\s)NCCL (INFO|WARN|ERROR|TRACE)\b")


@dataclass(slots=True)
class LogLine:
    """One parsed line. ``raw`` is the line as written (ANSI colour and ``\\r`` removed)."""

    index: int
    pos: int
    lineno: int | None
    raw: str
    msg: str  # the message, prefixes peeled, leading indentation kept
    tags: tuple[str, ...] = ()
    level: str | None = None
    time: str | None = None
    source: str | None = None
    relayed: bool = False  # a front-end's "[Info] (Component)" relays it: its level is the child's, if any

    @property
    def process(self) -> str | None:
        """The deepest (last peeled) process tag, e.g. ``Worker pid=7506``."""
        return self.tags[-1] if self.tags else None

    @property
    def headered(self) -> bool:
        """True when a logger header (level or source) was peeled."""
        return self.level is not None or self.source is not None

    @property
    def severity(self) -> int:
        return SEVERITY.get(self.level or "", 0)


def clean(text: str) -> str:
    """Remove ANSI colour and carriage returns; a progress bar keeps its last state."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\r" in text:
        text = text.rstrip("\r")
        if "\r" in text:
            parts = [p for p in text.split("\r") if p.strip()]
            text = parts[-1] if parts else ""
    return text


_TAG_TRIM = re.compile(r"^[\s(\[<]+|[\s)\]>:|]+$")


# Python 3.11 exception groups draw a gutter: "  + Exception Group Traceback", "  | " before every line
# of a (sub-)traceback, "+-+---- 1 ----" between sub-exceptions and "+------" after the last one.
_EG_GATE = re.compile(r"\s*(?:\| |\|$|\+-|\+ Exception Group Traceback)")
_EG_SEPARATOR = re.compile(r"^\s*\+(?:-\+)*-+(?: (?:\d+|\.\.\.)(?: and \d+ more exceptions)? -+)?\s*$")
_EG_PIPE = re.compile(r"^\s*\| ?")
_EG_HEAD = re.compile(r"^\s*\+ Exception Group (Traceback \(most recent call last\):)")


def _exception_group_gutter(msg: str) -> str:
    """The message inside an exception group's gutter; its separators read as blank lines."""
    if _EG_SEPARATOR.match(msg):
        return ""
    m = _EG_HEAD.match(msg)
    if m:
        return m.group(1)
    out = _EG_PIPE.sub("", msg, count=1)
    if out.startswith("Exception Group Traceback"):
        out = out[len("Exception Group ") :]
    return out


def parse_line(index: int, line: Line, extra_tags: Sequence[tuple[re.Pattern[str], bool]] = ()) -> LogLine:
    """Peel every prefix off one line. Never raises on odd input.

    ``extra_tags`` are the rules' tag patterns the built-in peelers do not
    know (added by a user's rules file): (regex, only at line start).
    """
    text = line.text if isinstance(line.text, str) else str(line.text)
    raw = clean(text) if ("\x1b" in text or "\r" in text) else text
    s = raw if len(raw) <= MAX_PARSE else raw[:MAX_PARSE]
    if "&" in s and ";" in s:
        s = html.unescape(s)
    if "\xa0" in s:
        s = s.replace("\xa0", " ")
    if s and s[0] in _FRAMES:
        s = unframe(s)
    if _ANSI_GATE.search(s) is not None or s.endswith("^M"):
        s = _ANSI_LOST.sub("", s)
    tags: list[str] = []
    level: str | None = None
    time: str | None = None
    source: str | None = None
    relay = False  # a front-end's "[Info] " was peeled: its component may follow
    after_time = -1  # where a full date peeled by _ISO_TIME ended: a level word may follow it
    i, n = 0, len(s)
    for step in range(12):
        if i >= n:
            break
        m = None
        if step == 0:
            if s.find("| ", 0, 120) >= 0:
                m = _COMPOSE.match(s)
            if m is None and s.find(" [std", 0, 160) > 0:
                m = _STREAM_COL.match(s)
            if m is None and s.find(": ", 0, 80) > 0:
                m = _PDSH.match(s)
                if m is None and "Test " in s:
                    m = _NCCL_TESTS.match(s)
                if m is None and s.find("]: ", 0, 120) > 0:
                    m = _UNIT_PID.match(s)  # an export's "[host ]gemma3.server[16376]: ..." (time already gone)
        elif source is None and tags and tags[-1] in _RAY_SYS_TAGS and s.find(": ", i, i + 80) > 0:
            m = _RAY_CPP_SRC.match(s, i)  # "(raylet) node_manager.cc:3069: ..."
        elif step == 1 and time is not None and not tags and level is None and s.find("]: ", i, i + 120) > 0:
            m = _UNIT_PID.match(s, i)  # "2026-03-25T19:17:07+02:00 gemma3.server[16376]: ..."
        elif relay and source is None and s[i] == "(" and s.find(")", i, i + 42) > i:
            m = _PAREN_COMPONENT.match(s, i)  # a front-end's "[Error] (Process) ": the component after its level
        elif relay and level is None and source is None and i < n and s[i] in _FRAMES:
            s = s[:i] + unframe(s[i:])  # the child drew a terminal UI's frame around its line
            n = len(s)
            continue
        elif relay and level is None and source is None and s.find(": ", i, i + 80) > i:
            m = _PDSH.match(s, i)  # the child's own "host: " (pdsh, srun --label) behind the relay
        elif tags and level is None and s.find(": Test ", i, i + 80) > i:
            m = _NCCL_TESTS.match(s, i)  # mpirun's "[1,0]<stdout>:" before nccl-tests' "node7: Test NCCL failure"
        if m is None:
            c = s[i]
            if source is not None and c != "[" and c != "(":
                break  # after a logger header only a bracketed prefix can follow
            for rx in _DISPATCH.get(c, _OTHER_SCRIPT if c.isalpha() else ()):
                m = rx.match(s, i)
                if m is not None:
                    break
            if m is None and i == after_time and level is None and c in "CDEFIW":
                m = _LEVEL_WORD.match(s, i)  # "<date> ERROR <logger> ...": the header's level after its time
            if m is None:
                for rx, at_start in extra_tags:
                    if at_start and i:
                        continue
                    m = rx.match(s, i)
                    if m is not None and m.end() > i:
                        break
                else:
                    break
                tag = _TAG_TRIM.sub("", m.group(0))
                if tag:
                    tags.append(tag)
                i = m.end()
                if i < n and s[i] == " " and not m.group(0)[-1:].isspace():
                    i += 1
                continue
        if m.re is _ISO_TIME:
            after_time = m.end()
        if m.re is _BRACKET_LEVEL_TITLE:
            relay = True
            lv = _RELAY_LEVEL.get(m.group("relay"))
            if lv is not None and SEVERITY[lv] > SEVERITY.get(level or "", 0):
                level = lv
        for name in _GROUPS[m.re]:
            v = m.group(name)
            if not v:
                continue
            if name == "tag":
                tags.append(v)
            elif name == "level":
                lv = _LEVEL_ALIASES.get(v, v)
                if lv not in SEVERITY:  # logfmt's lower-case words
                    lv = _LEVEL_ALIASES.get(v.upper(), v.upper())
                if level is None or SEVERITY.get(lv, 0) > SEVERITY.get(level, 0):
                    level = lv
            elif name == "time":
                if time is None:
                    time = v.strip('"')  # logfmt may quote it
            elif source is None:
                source = v.strip('"')
        if m.re is _PIPE_LOGGER and source in _RELAYED_STREAMS:
            level = None
        i = m.end()
    msg = (s[i:] if i else s).rstrip()
    if msg[:1] in " |+" and _EG_GATE.match(msg):
        msg = _exception_group_gutter(msg)
    if msg.endswith("cluster]") and "[repeated " in msg:
        msg = _RAY_REPEAT.sub("", msg)
    if level is None and "NCCL " in msg[:200]:
        nm = _NCCL_LEVEL.search(msg[:200])
        if nm:
            level = {"WARN": "WARNING", "TRACE": "DEBUG"}.get(nm.group(1), nm.group(1))
    return LogLine(index, line.pos, line.lineno, raw, msg, tuple(tags), level, time, source, relay)


def split_text(text: str | bytes) -> list[Line]:
    """Split a whole log into Lines with byte offsets, as the funnel would report them."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    out: list[Line] = []
    pos = 0
    ascii_text = text.isascii()
    for i, part in enumerate(parts, 1):
        out.append(Line(pos, part, i))
        pos += (len(part) if ascii_text or part.isascii() else len(part.encode("utf-8", "surrogatepass"))) + 1
    return out


def adjacent(prev: LogLine | None, cur: LogLine) -> bool:
    """Whether ``cur`` is (loosely) the next line of the file after ``prev``.

    The funnel's lines are sparse, so list neighbours need not be file
    neighbours: compare line numbers, else byte offsets.
    """
    if prev is None:
        return False
    if prev.lineno is not None and cur.lineno is not None:
        return cur.lineno == prev.lineno + 1
    span = len(prev.raw.encode("utf-8", "surrogatepass")) if not prev.raw.isascii() else len(prev.raw)
    return prev.pos < cur.pos <= prev.pos + span + 2


_VLLM_T = re.compile(r"^(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d(?:\.\d+)?)$")
_ISO_T = re.compile(r"^\d{4}-(\d\d)-(\d\d)[T -](\d\d):(\d\d):(\d\d(?:[.,]\d+)?)")
_GLOG_T = re.compile(r"^(\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d(?:\.\d+)?)$")


@functools.lru_cache(maxsize=1 << 16)  # a watch compares the same few thousand times on every burst
def time_key(t: str | None) -> float | None:
    """Seconds since the start of a (notional) year, to compare times of one log."""
    if not t:
        return None
    m = _VLLM_T.match(t) or _ISO_T.match(t) or _GLOG_T.match(t)
    if not m:
        return None
    try:
        mo, d, h, mi = (int(x) for x in m.groups()[:4])
        s = float(m.group(5).replace(",", "."))
    except ValueError:
        return None
    return (((mo * 31 + d) * 24 + h) * 60 + mi) * 60 + s


class ParseCache:
    """What ``parse_line`` peeled off each line text, for a caller that analyses the same lines again and
    again: a watch re-analyses a host's whole buffer on every burst, and peeling prefixes was most of
    that work. A line's parse depends on its text (and the rules' tag peelers) alone; its index, offset
    and line number are the caller's. Bounded: emptied when it holds ``limit`` texts or ``chars``
    characters of them."""

    def __init__(self, limit: int = 20_000, chars: int = 4_000_000):
        self.limit = limit
        self.max_chars = chars
        self._tables: dict[tuple[tuple[re.Pattern[str], bool], ...], dict[str, tuple]] = {}
        self.size = 0
        self.chars = 0

    def table(self, extra_tags: Sequence[tuple[re.Pattern[str], bool]]) -> dict[str, tuple]:
        if self.size >= self.limit or self.chars >= self.max_chars:
            self._tables.clear()
            self.size = self.chars = 0
        return self._tables.setdefault(tuple(extra_tags), {})

    @contextmanager
    def active(self) -> Iterator[ParseCache]:
        """Every ``parse_all`` inside the block (in this thread or task) uses this cache."""
        token = _CACHE.set(self)
        try:
            yield self
        finally:
            _CACHE.reset(token)


_CACHE: ContextVar[ParseCache | None] = ContextVar("fleetdiag_parse_cache", default=None)


# A traceback's frame line ('  File "x.py", line 3, in f') and an exception's own line ("torch.OutOfMemoryError: …"):
# defined here because the relay check below reads them; tracebacks.py builds its traceback reading on these.
FRAME = re.compile(r'^\s*File "(?P<p>[^"]*)", line \d+')
_EXC_NAME = (
    r"(?:[A-Za-z_]\w*\.)*"
    r"(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault|Failure|Timeout)|Exception|KeyboardInterrupt|StopIteration)"
)
EXC_STANDALONE = re.compile(r"^(?P<type>" + _EXC_NAME + r"(?:\([\w.]+\))?)(?:: (?P<msg>.*)|:?$)")


def _child_line(msg: str) -> bool:
    """What only a child's stderr holds: a traceback's frame or an exception's own line."""
    return bool(FRAME.match(msg) or EXC_STANDALONE.match(msg))


def _relays_at_info(out: list[LogLine]) -> list[LogLine]:
    """Drop the INFO of a relay that writes a child's every line at INFO (a GUI's "[time] [INFO] " before
    what its training subprocess printed, the child's traceback included).

    No logger writes a traceback's head and its frames or its exception as records of their own at INFO: the
    prefix on them is a relay's, so its INFO says nothing about what the child's lines say; their own words
    decide (as for FastChat's stderr stream and a front-end's title-case ``[Info]``).
    """
    heads = {ln.source for ln in out if ln.level == "INFO" and ln.msg.startswith("Traceback (most recent call last)")}
    if not heads or not any(ln.level == "INFO" and ln.source in heads and _child_line(ln.msg) for ln in out):
        return out
    for ln in out:
        if ln.level == "INFO" and ln.source in heads:
            ln.level, ln.relayed = None, True
    return out


def parse_all(lines: Sequence[Line], extra_tags: Sequence[tuple[re.Pattern[str], bool]] = ()) -> list[LogLine]:
    """Every line parsed (a memo shares the work between lines of the same text), then a relay's INFO dropped."""
    return _relays_at_info(_parse_all(lines, extra_tags))


def _parse_all(lines: Sequence[Line], extra_tags: Sequence[tuple[re.Pattern[str], bool]] = ()) -> list[LogLine]:
    cache = _CACHE.get()
    if cache is None:
        return [parse_line(i, ln, extra_tags) for i, ln in enumerate(lines)]
    memo = cache.table(extra_tags)
    out: list[LogLine] = []
    for i, ln in enumerate(lines):
        fields = memo.get(ln.text) if isinstance(ln.text, str) else None
        if fields is None:
            p = parse_line(i, ln, extra_tags)
            if isinstance(ln.text, str):
                memo[ln.text] = (p.raw, p.msg, p.tags, p.level, p.time, p.source, p.relayed)
                cache.size += 1
                cache.chars += len(ln.text) + len(p.msg)
            out.append(p)
        else:
            out.append(LogLine(i, ln.pos, ln.lineno, *fields))
    return out
