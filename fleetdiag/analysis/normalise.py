"""One normalisation step before analysis: logs in unusual order or dress.

Logs reach users through log services and pastes: an export newest-first, a
service's own timestamp and severity before every line (CloudWatch, Loki,
GCP, Datadog, ``kubectl logs --timestamps``), CRLF line ends, lines
re-wrapped by a terminal at its width, and the markdown a paste into an issue
or a chat wraps around a log (fences, block quotes, inline code, ``<details>``
tags, a bullet, a user's ``...`` elision). Each is detected from the log itself
(never from a product name) and undone here, so the rest of the analyzer
sees the program's own lines in the order it wrote them.

``normalise`` returns the lines to analyse and a map from each new line's
position back to the original line, so the answer still points at the line
as it is in the file.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ..records import Line
from ..timestamps import MONTH_WORD
from .lines import ISO_DATE, MONTH_DAY_TIME

_TS = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z| ?[+-]\d\d:?\d\d| UTC)?"
_ISO_ZONED = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)"
_SEV = (
    r"(?:DEFAULT|DEBUG|INFO|NOTICE|WARNING|WARN|ERROR|CRITICAL|ALERT|EMERGENCY|FATAL"
    r"|debug|info|notice|warning|warn|error|critical|fatal|[IWEDF])"
)
# the stream a container runtime or collector read the line from, after its stamp: CRI's "stdout F",
# a sidecar's "1 stdout:" (the fd and the stream)
_STREAM = r"(?:[\t ]+(?:\d[\t ]+)?(?:stdout|stderr)(?:[\t ]+[FP](?=[\t ])|:)?)?"


# a service's prefix: [severity] timestamp [severity] [stream], in a table cell, quoted (CSV) or
# tab-separated; or epoch milliseconds
# (a severity that the program's own dated header follows after a blank is the program's: vLLM's
# "ERROR 10-10 14:03:52", Ray Serve's "ERROR 2024-09-19 08:23:55,732"; a tab-separated one is the collector's column)
# (the dates are the line parser's own: lines.MONTH_DAY_TIME and lines.ISO_DATE)
def _stamped(after: bool) -> re.Pattern[str]:
    """A service's stamp, its severity before it or not, and (``after``) a severity column after it."""
    sev_after = (
        r'(?P<sev_after>[\t ,]+"?\[?'
        + _SEV
        + r'\]?"?(?![\t ]+'
        + MONTH_DAY_TIME
        + "| +"
        + ISO_DATE
        + r")(?: *(?= ))?)?"
    )
    return re.compile(
        r'^(?:"?'
        + _SEV
        + r'"?[\t ,]+)?"?(?P<ts>'
        + _TS
        + r')"?'
        + (sev_after if after else "")
        + _STREAM
        + r'(?:\t|,| )"?'
    )


_STAMP_SEV = _stamped(after=True)
# the same stamp when the severity column after it is not the service's: a CI runner stamps every line and only
# some lines carry a severity there, the program's own ("…Z [ERROR] Exception …"), which stays on the line
_STAMP_ONLY = _stamped(after=False)
_PREFIXES = (
    re.compile(r"^\s*\|?\s*(?P<ts>" + _TS + r")\s*\|\s?"),
    _STAMP_SEV,
    re.compile(r"^(?P<epoch>1\d{9}(?:\d{3})?(?:\.\d+)?)[\t ,]+"),
    # a CI runner's stamp in brackets, with the runner's word before it or not: Buildkite's
    # "[2025-05-19T12:00:07Z] ", Taskcluster's "[task 2024-05-16T19:35:55.564Z] ". Only the ISO form with its
    # "T" and zone: a program's own "[2024-05-01 12:00:00,123] " (DeepSpeed's logger) is the line's own stamp
    re.compile(r"^\[(?:[A-Za-z][\w.-]{0,30} )?(?P<ts>" + _ISO_ZONED + r")\] ?"),
    # a runner's clock alone (Jenkins' timestamper: "12:00:07 "), before nearly every line
    re.compile(r"^(?P<clock>\d\d:\d\d:\d\d(?:[.,]\d{1,6})?)(?: |$)"),
)
_MONTH_TS = MONTH_WORD + r" [ 0-3]\d \d\d:\d\d:\d\d(?:\.\d+)?"
# a journal's or a syslog file's line: stamp, host, identifier[pid] (journalctl -o short, short-iso,
# short-precise; /var/log/syslog). The line model reads it (the identifier is the process tag); only
# the order check looks past it, at the program's own text
_SYSLOG = re.compile(r"^(?:(?:" + _TS + "|" + _MONTH_TS + r") )?(?:\S+ )?[\w.@/-]+\[\d+\]: ")
# after a prefix is removed, what shows the remainder is a log line of its own; so does a host's tag
# ("node-7: ", "HCA-14: ", "ip-10-0-3-7: ", "node07.cluster.local: ": a name with a digit or hyphen, as pdsh,
# srun --label and nccl-tests print it; any host name before nccl-tests' "Test NCCL failure"; mpirun's
# "[1,3]<stdout>:"; a shared library's "…so.12: " is the rest of a message: "libnv" + "rtc.so.12: cannot open
# shared object file"), which keeps a fixed-width table (nccl-tests' result rows) from reading as lines a
# terminal cut
_OWN_HEADER = re.compile(
    r"^(?:\(\w[^)]*pid=\d+|\[(?:\d+(?=[-:./ T\]])|[A-Za-z][\w.+/:-]*\])|Traceback|\s+File \"|"
    r"\[\d+,\d+\]<std(?:out|err)>:|[A-Za-z0-9][\w.-]*: Test (?:NCCL|CUDA) failure |"
    r"(?=[A-Za-z0-9.-]*[0-9-])(?![A-Za-z0-9-]*\.so[.:])[A-Za-z0-9][A-Za-z0-9.-]*: \S|"
    + _TS
    + r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b|[IWEF]\d{4} |\d\d-\d\d \d\d:|[A-Za-z_][\w.]*(?:Error|Exception)\b)"
)
_RULE = re.compile(r"^\s*([-=~_*#+])\1{3,}")  # a separator line is a line of its own
_TB_START = re.compile(r"Traceback \(most recent call last\):\s*$")
_FRAME = re.compile(r'^\s+File "')
_DIGITS = re.compile(r"\d+")
_TIME_KEY = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d(?:[.,]\d+)?)")

SHARE = 0.8  # of non-empty lines that must carry one prefix for it to be the service's
SEVERITY_SHARE = 0.5  # of the stamped lines that carry a severity after the stamp, for it to be the service's column
# a sidecar's or a log collector's own label before every line: "[pod-name] ", "[VllmSidecar id]: ",
# "[pod/name/container] " (kubectl logs --prefix). One literal label on (nearly) every line says only
# which stream the lines came from, so it goes; a label that varies is a process tag the line model peels.
# A label may start with a digit when it has a letter and no clock in it: a job runner's
# "[177/train/578 (pid 28936)] [09c561ee-…] " after its own stamp.
# A bare number is a label only when it is a pid's (2 to 7 digits) on nearly every line: a server that
# names its own process before each line ("[46009] ", llama.cpp's router and its forks); a varying number
# is a rank or a job's tag, kept by the line model.
_LABEL = re.compile(r"^\[(?P<label>[A-Za-z0-9][^\[\]]{0,100})\]:? ")
_NOT_LABEL = re.compile(
    r"^(?:rank|default)\d+$|\|\d+$|^(?i:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE|NOTICE)$|^[IWEF]\d|^[IWEF] |\.py:\d+"
    r"|^(?!\d{2,7}$)[^A-Za-z]*$|\d:\d\d"
)
LABELS = 3  # constant labels in a row, at most (a runner's step label, then its run id)
# a front-end's own name for the program it relays, as a word and a colon ("SUBPROCESS: ", "STDERR: "): a
# capitalised word without "_" or "." (a C function's "llama_model_loader: " or a logger's "vllm.engine: "
# repeated on a window is the program's own text, not a label)
_WORD_LABEL = re.compile(r"^(?P<label>[A-Z][A-Za-z0-9-]{1,39}): ")
_NOT_WORD_LABEL = re.compile(
    r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE|NOTICE|Traceback|File|Caused|Note|Hint)$|(?:Error|Exception|Warning)$",
    re.IGNORECASE,
)

# Markdown around a pasted log (an issue, a chat): a fence line (```, ```python, ~~~), a fence glued to the
# first or last line of the log, a block quote's "> " (nested too), inline code's backticks around one line
# (the closing one alone on the next line), <details>/<summary>/<pre> tags, a line marked in bold, and a bullet
# before a traceback or an exception. Stripped per line, never the text between: a line keeps whatever it says after the dress.
# (a glued fence is a backtick one: "~~~~~^^^^" and "^^^^~~~~" are the carets under a Python 3.11+ frame's code)
_FENCE_ONLY = re.compile(r"^[ \t]{0,3}(?:`{3,}|~{3,})[ \t]*[\w+#.-]*\s*$")
_FENCE_OPEN = re.compile(r"^\s*`{3,}(?=[^`\s])")
_FENCE_CLOSE = re.compile(r"(?<=\S)`{3,}\s*$")
# a quote starts at the line's first column (" > 0) failed" is the rest of a line a paste cut)
_QUOTE = re.compile(r"^>(?:[ \t]|$)(?:[ \t]{0,3}>(?:[ \t]|$))*|^>+(?=\s|$)")
_TAGS = re.compile(
    r"^\s*(?:</?(?:details|pre|code|blockquote)(?:\s[^<>]{0,200})?>\s*)+$"
    r"|^\s*<summary>[^<>]{0,300}</summary>\s*$|^\s*</?summary>\s*$",
    re.IGNORECASE,
)
_TICK_OPEN = re.compile(r"^`(?=[^`\s])")
_TICK_CLOSE = re.compile(r"(?<=[^`\s])`\s*$")
_BOLD = re.compile(r"^(\s*)\*\*(?=[^*\s])(.*[^*\s])\*\*\s*$")  # a line a user marked in bold: "**RuntimeError: …**"
# bold over several lines: its opening "**" glued to the first line's start, its closing one to the last line's end
_BOLD_OPEN = re.compile(r"^\*\*(?=[^*\s])")
_BOLD_CLOSE = re.compile(r"(?<=[^*\s])\*\*\s*$")
_BULLET = re.compile(r"^[ \t]{0,3}[-*+] (?=Traceback \(|[A-Za-z_][\w.]*(?:Error|Exception)\b)")
# a user's elision of lines: "...", "…", "[...]", "(...)", "<snip>", "[snip]", "... (truncated) ...", "<omitted>"
_ELISION = re.compile(
    r"^\s*(?:\.{3,}|…|[\[(<]\s*(?:\.{3,}|…|snip(?:ped)?|omitted|truncated)\s*[\])>]"
    r"|\.{3}\s*\(?(?:snip(?:ped)?|omitted|truncated|more)\)?\s*\.{3})\s*$",
    re.IGNORECASE,
)


# a runner that relays every node's streams names the node and the stream before each line it prints
# ("dinov2-giant-nodes.cn-d004 [stderr] ", milabench; its "[start]", "[end (1)]" lines); its console wraps
# a long line at a blank and prints the rest without the name
_STREAMED = re.compile(r"^[A-Za-z0-9][\w.-]* \[(?:stdout|stderr|start|end(?: \(-?\d+\))?)\] ")
STREAMED_SHARE = 0.5  # of non-empty lines that carry the runner's name and stream

# A message relayed inside a quoted string, its newlines and quotes escaped: Triton's
# ``E0221 … model_lifecycle.cc:654] "failed to load …: [TensorRT-LLM][ERROR] Assertion failed: …\n1  0x7f…"``,
# a JSON error body ``{"error": "Traceback …\n  File \"…\", line 3 …\nValueError: …"}``, a repr'd exception.
# Unfolded at each ``\n`` when a later part opens a line of a log of its own (a traceback, a frame, an exception,
# a native stack's numbered address, a library's own "[Name][ERROR] " record), so the relayed error competes as
# a line of its own; a prompt or a config dump with newlines in it has none of those and stays one line.
_ESC_NL = re.compile(r"(?<!\\)\\n")
_RELAYED_PART = re.compile(
    r"^(?:Traceback \(most recent call last\)|\s*File \\?\"|\s*\d{1,3}\s+0x[0-9a-f]{6,}\s|\s*frame #\d+: |"
    r"\[[A-Za-z][\w.+-]*\] ?\[(?:ERROR|FATAL|E|F)\] |[A-Za-z_][\w.]*(?:Error|Exception)(?:\([\w.]+\))?: \S)"
)
# the relayed record of a native library inside another message ("…modelInstanceState: [TensorRT-LLM][ERROR]
# Assertion failed: …"): the library's own record starts there, so it is a line of its own too
_INNER_RECORD = re.compile(r"(?<=: )\[[A-Za-z][\w.+-]*\] ?\[(?:ERROR|FATAL|E|F)\] (?=\S)")
# an exception's head with nothing of its own after it, behind whatever prefix ("RuntimeError:", "[rank0]:
# RuntimeError:", a relay's "[Info] (Process) RuntimeError:")
_BARE_HEAD = re.compile(r"(?:^|(?<=[\s\]):]))[A-Za-z_][\w.]*(?:Error|Exception)\w*:$")
MAX_UNFOLD = 400  # parts of one line, at most: a relayed message is bounded like any other
_UNESCAPE = {'\\"': '"', "\\'": "'", "\\t": "\t", "\\\\": "\\"}
_ESCAPED = re.compile(r"\\[\"'t\\]")


def _unescaped(part: str) -> str:
    return _ESCAPED.sub(lambda m: _UNESCAPE[m.group(0)], part) if "\\" in part else part


def _split_inner(part: str) -> list[str]:
    """A part with a native library's record inside it: the text before it, then the record."""
    if "][" not in part and "] [" not in part:
        return [part]
    m = _INNER_RECORD.search(part, 1)
    if m is None:
        return [part]
    head = part[: m.start()].rstrip()
    if _BARE_HEAD.search(head):  # "RuntimeError: [TensorRT-LLM][ERROR] …": the record is the whole message
        return [part[m.start() :]]
    return [head, part[m.start() :]]


def unfold(text: str) -> list[str] | None:
    """The lines of a message relayed inside one quoted line (escaped newlines and quotes), or None when the
    line relays no log of its own. Each part is the file's own text (escapes kept), so the answer quotes the
    file; the line model reads the unescaped text."""
    if "\\n" not in text or '"' not in text and "'" not in text:
        return None
    parts = _ESC_NL.split(text, MAX_UNFOLD - 1)
    if len(parts) < 2 or not any(_RELAYED_PART.match(_unescaped(p)) for p in parts[1:]):
        return None
    out: list[str] = []
    for p in parts:
        out.extend(_split_inner(p))
    return [p for p in out if p.strip()] or None


# tqdm's bar redrawn with a carriage return and no newline, a rank's record written straight after it:
# "99%|█████████▉| 23054/23316 [2:22:47<01:34,  2.79it/s][rank1]:[E1101 …] Watchdog caught …"
_GLUED_BAR = re.compile(r"\|\s*\d+/\d+ \[[\d:]+<[\d:?]+,[^\]\[]*\](?=\[)")


def _unfolded(
    work: list[tuple[str, int, float | None]],
) -> tuple[list[tuple[str, int, float | None]], dict[int, str], int]:
    """Relayed messages unfolded into their lines, glued progress bars split off; ``shown`` maps a new line's place
    to the file's text of it; the count is of the bars split off."""
    out: list[tuple[str, int, float | None]] = []
    shown: dict[int, str] = {}
    bars = 0
    for t, k, st in work:
        parts = unfold(t) if "\\n" in t else None
        if parts is None:
            if "]" in t and "%|" in t and (bar := _GLUED_BAR.search(t)) is not None:
                for q in (t[: bar.end()], t[bar.end() :]):
                    shown[len(out)] = q
                    out.append((q, k, st))
                bars += 1
                continue
            if "][" in t and ": [" in t:
                inner = _split_inner(t)
                if len(inner) > 1:
                    for q in inner:
                        shown[len(out)] = q
                        out.append((q, k, st))
                    continue
            out.append((t, k, st))
            continue
        for q in parts:
            shown[len(out)] = q
            out.append((_unescaped(q), k, st))
    return out, shown, bars


def _streams_joined(work: list[tuple[str, int, float | None]]) -> tuple[list[tuple[str, int, float | None]], bool]:
    """A relaying runner's wrapped lines joined: in a log where the runner names nearly every line, a line without
    the name and stream is the rest of the line before it (the console wrapped it at a blank, which a paste may
    have trimmed)."""
    texts = [t for t, _, _ in work if t.strip()]
    if len(texts) < 3:
        return work, False
    named = sum(1 for t in texts[:400] if _STREAMED.match(t))
    if named < STREAMED_SHARE * min(len(texts), 400):
        return work, False
    out: list[tuple[str, int, float | None]] = []
    joined = False
    for t, k, st in work:
        if out and t.strip() and not _STREAMED.match(t) and _STREAMED.match(out[-1][0]):
            prev = out[-1][0]
            out[-1] = (prev + t if prev.endswith(" ") else f"{prev} {t}", out[-1][1], out[-1][2])
            joined = True
            continue
        out.append((t, k, st))
    return out, joined


# docker compose's service column before every line it relays ("tabbyapi-1  | ", padded to the longest name; an
# empty line keeps "tabbyapi-1  |"). One service on (nearly) every line says only which container wrote the log:
# the column goes and the service is the process of a line that names none of its own. Several services
# interleaved are stages the line model keeps apart (their column is each line's tag).
_SERVICE = re.compile(r"^(?P<name>[A-Za-z0-9][\w.-]{0,80}?) +\|(?: |$)")
# compose's own lines between the services' ("Attaching to app-1", "app-1 exited with code 1", "Gracefully stopping…")
_COMPOSE_OWN = re.compile(
    r"^(?:Attaching to |[\w.-]+ exited with code -?\d+\s*$|Gracefully stopping|Aborting on container exit|Stopping [\w.-]+ )"
)


def _without_service(
    work: list[tuple[str, int, float | None]],
) -> tuple[list[tuple[str, int, float | None]], str | None]:
    """The lines without the one compose service's column nearly every line starts with, and that service."""
    texts = [t for t, _, _ in work if t.strip()]
    if len(texts) < 3 or not any("|" in t[:120] for t in texts[:3]):
        return work, None
    names = Counter(m.group("name") for m in map(_SERVICE.match, texts[:400]) if m is not None)
    if not names:
        return work, None
    name = names.most_common(1)[0][0]
    col = re.compile(r"^" + re.escape(name) + r" +\|(?: |$)")
    if sum(1 for t in texts if col.match(t) or _COMPOSE_OWN.match(t)) < SHARE * len(texts):
        return work, None
    return [(col.sub("", t, count=1), k, st) for t, k, st in work], name


@dataclass
class Normalised:
    """What was undone, for the reason line and tests."""

    lines: list[Line]
    origin: dict[int, Line] = field(default_factory=dict)  # new pos -> the original line
    steps: list[str] = field(default_factory=list)  # "prefix", "newest-first", "re-wrapped at 120"
    service: str | None = None  # the one compose service whose column was removed from every line

    def original(self, pos: int | None) -> Line | None:
        return self.origin.get(pos) if pos is not None else None


def _prefix(lines: list[Line]) -> re.Pattern[str] | None:
    """The service prefix most lines carry (a timestamp and severity the service added)."""
    texts = [ln.text for ln in lines if ln.text.strip()]
    if len(texts) < 2:
        return None
    sample = texts[:200] + texts[-200:] if len(texts) > 400 else texts
    for n, rx in enumerate(_PREFIXES):
        if n and len(texts) < 3:  # a bare timestamp on two lines is too little to call it a service's
            continue
        if sum(1 for t in sample if rx.match(t)) >= SHARE * len(sample):
            return rx
    return None


# pytest's report of a failed test marks every line of the exception it caught with "E" and seven spaces (an
# empty line of it with a bare "E"): a test runner's label on the program's own lines, which no log writes
# otherwise (glog's "E1201 …" has its date there)
_PYTEST_E = "E       "


def _constant_label(texts: list[str]) -> str | None:
    """The one ``[label] `` every line starts with (a sidecar's or collector's), or None."""
    lines = [t for t in texts if t.strip()]
    if len(lines) < 2:
        return None
    marked = sum(1 for t in lines[:400] if t.startswith(_PYTEST_E) or t == "E")
    if marked >= 3 and marked >= len(lines[:400]) / 2:  # (its long lines may be cut by a terminal: half is enough)
        return _PYTEST_E
    heads = Counter(m.group(0) for m in map(_LABEL.match, lines[:400]) if m is not None)
    words = Counter(m.group(0) for m in map(_WORD_LABEL.match, lines[:400]) if m is not None)
    if not heads and not words:
        return None
    if words and (not heads or words.most_common(1)[0][1] > heads.most_common(1)[0][1]):
        head = words.most_common(1)[0][0]
        if _NOT_WORD_LABEL.search(head[:-2]):
            return None
    else:
        head = heads.most_common(1)[0][0]
        if _NOT_LABEL.search(head[1 : head.index("]")]):
            return None
    bare = head.rstrip()  # a label on an empty message keeps no space after it
    if sum(1 for t in lines if t.startswith(head) or t == bare or t == bare.rstrip(":")) < SHARE * len(lines):
        return None
    return head


def _without_labels(work: list[tuple[str, int, float | None]]) -> tuple[list[tuple[str, int, float | None]], bool]:
    """The lines without the constant labels (up to LABELS in a row) nearly every one starts with."""
    done = False
    for _ in range(LABELS):
        head = _constant_label([t for t, _, _ in work])
        if head is None:
            break
        bare = head.rstrip()
        work = [
            (t[len(head) :] if t.startswith(head) else "" if t in (bare, bare.rstrip(":")) else t, k, st)
            for t, k, st in work
        ]
        done = True
    return work, done


def _severity_column(rx: re.Pattern[str], texts: list[str]) -> bool:
    """Do most stamped lines carry a severity after the stamp (a collector's column), not a few (the program's)?"""
    ms = [m for m in map(rx.match, texts[:400]) if m is not None]
    return sum(1 for m in ms if m.group("sev_after")) >= SEVERITY_SHARE * len(ms)


def _unprefixed(text: str, rx: re.Pattern[str]) -> str:
    """The line without the service's prefix (a CSV export's closing quote too)."""
    m = rx.match(text)
    if m is None:
        return text
    return text[m.end() :].rstrip('"') if text[m.start() : m.end()].endswith('"') else text[m.end() :]


_FULL_DATE = re.compile(r"\d{4}-\d\d-\d\d")


def filed_time(filed: str, own: str | None) -> str | None:
    """The time to report for a line whose service prefix was removed: the prefix's full stamp when the line's
    own time has no date with a year (a klog/glog ``I0809 13:32:51`` behind a container runtime's ISO stamp),
    else the line's own."""
    if own is not None and _FULL_DATE.match(own):
        return own
    for rx in _PREFIXES:
        if "ts" not in rx.groupindex:
            continue
        m = rx.match(filed)
        if m is not None and m.group("ts"):
            return m.group("ts")
    return own


def _time_of(text: str) -> float | None:
    m = _TIME_KEY.search(text[:80])
    if m is None:
        return None
    y, mo, d, h, mi = (int(x) for x in m.groups()[:5])
    return ((((y * 12 + mo) * 31 + d) * 24 + h) * 60 + mi) * 60 + float(m.group(6).replace(",", "."))


def _newest_first(texts: list[str], stamps: list[float | None]) -> bool:
    """Times mostly falling, or tracebacks printed upside down (frames before their header)."""
    seq = [t for t in stamps if t is not None]
    down = sum(1 for a, b in zip(seq, seq[1:]) if b < a)
    up = sum(1 for a, b in zip(seq, seq[1:]) if b > a)
    if (down >= 3 and down > 4 * up) or (down >= 2 and up == 0):
        return True  # a short export: every stamp falls
    upright = upside = 0
    for k, t in enumerate(texts):
        if "Traceback" not in t or not _TB_START.search(t):
            continue
        nxt = next((texts[j] for j in range(k + 1, min(k + 4, len(texts))) if texts[j].strip()), "")
        prv = next((texts[j] for j in range(k - 1, max(k - 4, -1), -1) if texts[j].strip()), "")
        if _FRAME.search(nxt):
            upright += 1
        elif _FRAME.search(prv):
            upside += 1
    return upside > 0 and upright == 0 and up <= down


def _cut(text: str) -> bool:
    """A line that could have been cut mid-text: it does not end in padding or a border."""
    return bool(text) and not text.endswith("  ") and text[-1] not in "│┃║|\t"


def _head(text: str) -> str:
    """A record's template at its start, its numbers aside ("GPU 1: " is "GPU 0: "'s)."""
    return _DIGITS.sub("0", text[:6])


def _wrap_width(lines: list[Line]) -> int | None:
    """The width a terminal or paste cut long lines at: many lines of exactly that length, none longer."""
    lens = [len(ln.text) if _cut(ln.text) else 0 for ln in lines]
    if len(lens) < 4:
        return None
    width = max(len(ln.text) for ln in lines)
    n = lens.count(width)
    if width < 60:
        return None
    if n < 2 or n < 0.05 * len(lens):
        return None
    if len({_DIGITS.sub("", ln.text) for ln in lines if len(ln.text) == width}) < 2:
        return None  # one line repeated (its stamps or counters aside): a template, not a terminal's cuts
    # a list whose every row is followed by the next row of its template (a tool's "GPU 0: <name> (UUID: GPU-…)",
    # "GPU 1: …", each as wide as the widest line): a terminal's cut is followed by the rest of its line instead
    full = [k for k, ln in enumerate(lines) if len(ln.text) == width]
    listed = sum(1 for k in full if k + 1 < len(lines) and _head(lines[k + 1].text) == _head(lines[k].text))
    if listed >= 2 and listed >= len(full) - 1:
        return None
    # a terminal cuts wherever the width falls, so some cut lands between two printed characters
    for a, b in zip(lines, lines[1:]):
        if len(a.text) == width and not a.text[-1].isspace() and b.text[:1] and not b.text[0].isspace():
            if _continues(a.text, b.text, a.text, width):
                return width
    return None


def _adjacent(a: Line, b: Line) -> bool:
    if a.lineno is not None and b.lineno is not None:
        return b.lineno == a.lineno + 1
    return a.pos < b.pos <= a.pos + len(a.text.encode("utf-8", "surrogatepass")) + 2


def undress(text: str) -> str | None:
    """One line without the markdown a paste wrapped it in; None for a line that is only dress (a fence, a tag,
    a user's elision). Linear: anchored patterns, each tried once."""
    if not text:
        return text
    c = text.lstrip()[:1]
    if c not in "`~><-*+.…[(" and text[-1:] != "*":
        return text  # the common case: a line that starts and ends like a log line
    out = text
    if c == ">" or c == "<":
        m = _QUOTE.match(out)
        if m is not None:
            out = out[m.end() :]
        if _TAGS.match(out):
            return None
    if _FENCE_ONLY.match(out) or _ELISION.match(out):
        return None
    m = _FENCE_OPEN.match(out)
    if m is not None:
        out = out[m.end() :]
    elif _TICK_OPEN.match(out):
        out = out[1:]
        out = _TICK_CLOSE.sub("", out) if out.count("`") % 2 else out
    if out.rstrip()[-1:] == "`":
        out = _FENCE_CLOSE.sub("", out)
    if out.strip() == "`":
        return None
    if out.endswith("**") or out.endswith("** "):
        m = _BOLD.match(out)
        if m is not None:
            out = m.group(1) + m.group(2)
        elif out.count("**") == 1:
            out = _BOLD_CLOSE.sub("", out)
    elif out.startswith("**") and out.count("**") == 1:
        out = _BOLD_OPEN.sub("", out)
    m = _BULLET.match(out)
    if m is not None:
        out = out[m.end() :]
    return out


def _undressed(work: list[tuple[str, int, float | None]]) -> tuple[list[tuple[str, int, float | None]], bool]:
    """The lines without a paste's markdown; lines that were only dress are dropped."""
    out: list[tuple[str, int, float | None]] = []
    changed = False
    for t, k, st in work:
        u = undress(t)
        if u is None:
            changed = True
            continue
        if u != t:
            changed = True
            if not u.strip() and t.strip("`~> \t"):
                u = t  # never strip a line to nothing that said something
        out.append((u, k, st))
    if not out:  # a log of nothing but dress: keep it as it is
        return work, False
    return out, changed


# a web log viewer's chrome copied between the log's lines, each on a line of its own: Buildkite's "Actions for L1556"
# and the line's number, GitHub Actions' link to the line ("[2595](https://github.com/…/runs/…#step:19:2596)")
_CHROME = re.compile(r"^(?:\d{1,7}|Actions for L\d{1,7}|\[\d{1,7}\]\(https?://[^)\s]+#step:\d+:\d+\))\s*$")
CHROME_SHARE = 0.25  # of non-empty lines that must be chrome for it to be the viewer's


def _without_chrome(work: list[tuple[str, int, float | None]]) -> tuple[list[tuple[str, int, float | None]], bool]:
    """The lines without a log viewer's chrome, when it sits between (nearly) every two of them."""
    texts = [t for t, _, _ in work if t.strip()]
    chrome = sum(1 for t in texts if _CHROME.match(t))
    if chrome < 3 or chrome < CHROME_SHARE * len(texts) or chrome == len(texts):
        return work, False
    return [w for w in work if not _CHROME.match(w[0])], True


def normalise(lines: list[Line]) -> Normalised:
    """Undo a service prefix, newest-first order and terminal re-wrapping (CR is stripped by the line model)."""
    out = Normalised(list(lines))
    if not lines or len(lines) < 2 and "\\n" not in lines[0].text and "][" not in lines[0].text:
        return out
    # (text, index of the original line, the export's own time) in the order being built
    work = [(ln.text[:-1] if ln.text.endswith("\r") else ln.text, k, _time_of(ln.text)) for k, ln in enumerate(lines)]
    changed = False
    work, chromed = _without_chrome(work)
    if chromed:
        out.steps.append("log viewer's line chrome removed")
        changed = True
    work, dressed = _undressed(work)
    if dressed:
        out.steps.append("markdown removed")
        changed = True
    work, service = _without_service(work)
    if service is not None:
        out.service = service
        out.steps.append("service column removed")
        changed = True
    work, labelled = _without_labels(work)
    if not chromed:  # the viewer's chrome behind markdown, a service's column or a label
        work, chromed = _without_chrome(work)
        if chromed:
            out.steps.append("log viewer's line chrome removed")
            changed = True
    rx = _prefix([Line(lines[k].pos, t, lines[k].lineno) for t, k, _ in work])
    if rx is _STAMP_SEV and not _severity_column(rx, [t for t, _, _ in work]):
        rx = _STAMP_ONLY
    records: set[int] = set()  # the lines that carried the service's prefix: each is a record of its own
    if rx is not None:
        new = [(_unprefixed(t, rx), k, st) for t, k, st in work]
        records = {k for (t, k, _), (u, _, _) in zip(work, new) if u != t}
        if any(a[0] != b[0] for a, b in zip(new, work)):
            work = new
            out.steps.append("service prefix removed")
            changed = True
            work, after = _without_labels(work)  # a runner's labels behind the service's stamp
            labelled = labelled or after
            inner = _prefix([Line(lines[k].pos, t, lines[k].lineno) for t, k, _ in work])
            same = inner is rx or (rx is _STAMP_ONLY and inner is _STAMP_SEV)
            if inner is not None and not same:  # a CI runner's stamp under a log service's (two exports)
                work = [(_unprefixed(t, inner), k, st) for t, k, st in work]
    if labelled:
        out.steps.insert(1 if dressed else 0, "line label removed")
        changed = True
    if changed:  # a paste's markdown inside a service's prefix or a relay's label (a bold one's start, behind it)
        work, inner_dress = _undressed(work)
        if inner_dress and not dressed:
            out.steps.append("markdown removed")
    width = _wrap_width([Line(lines[k].pos, t, lines[k].lineno) for t, k, _ in work])
    words = _word_wrap_width([t for t, _, _ in work])
    if words is not None and width is not None and words != width:
        words = None  # one console, one width: the exact cuts decide
    if width is not None or words is not None:
        joined: list[tuple[str, int, float | None]] = []
        last, at, first = "", -1, ""  # the physical line the joined text ends with, its index, the record's first
        cut = by_words = False
        for t, k, st in work:
            # a line the service stamped is the next record (newest first: the one before), not a cut
            if joined and _adjacent(lines[at], lines[k]) and k not in records:
                if width is not None and _continues(last, t, first, width):
                    joined[-1] = (joined[-1][0] + t, joined[-1][1], joined[-1][2])
                    last, at, cut = t, k, True
                    continue
                if words is not None and (width is None or len(last) < words) and _word_continues(last, t, words):
                    joined[-1] = (f"{joined[-1][0]} {t}", joined[-1][1], joined[-1][2])
                    last, at, by_words = t, k, True
                    continue
            joined.append((t, k, st))
            last, at, first = t, k, t
        if len(joined) < len(work):
            work = joined
            if cut:
                out.steps.append(f"lines re-wrapped at {width} columns joined")
            if by_words:
                out.steps.append(f"lines re-wrapped by words at {words} columns joined")
            changed = True
    own = [_SYSLOG.sub("", t, count=1) if "]: " in t[:160] else t for t, _, _ in work]
    if _newest_first(own, [st for _, _, st in work]):
        work.reverse()
        out.steps.append("newest-first order reversed")
        changed = True
    work, streamed = _streams_joined(work)
    if streamed:
        out.steps.append("re-wrapped by a runner's console")
        changed = True
    shown: dict[int, str] = {}
    if any("\\n" in t or "][" in t for t, _, _ in work):
        unfolded, shown, bars = _unfolded(work)
        if len(unfolded) > len(work):
            if len(unfolded) > len(work) + bars:
                out.steps.append("relayed message unfolded")
            if bars:
                out.steps.append("progress bar split from the line glued to it")
            work = unfolded
            changed = True
        else:
            shown = {}
    if not changed:
        return out
    # fresh positions and line numbers in the new order, so adjacency holds; origin maps them back (a part of
    # an unfolded line to that part of the file's line, so the answer quotes the part that decided)
    fresh: list[Line] = []
    pos = 0
    for n, (text, k, _) in enumerate(work, 1):
        part = shown.get(n - 1)
        out.origin[pos] = lines[k] if part is None else Line(lines[k].pos, part, lines[k].lineno)
        fresh.append(Line(pos, text, n))
        pos += len(text.encode("utf-8", "surrogatepass")) + 1
    out.lines = fresh
    return out


# A console that wraps by words (rich's, a terminal UI's) breaks a line at the last blank before its width and
# prints the rest on the next line, unindented: the line before a break is a little shorter than the width, and
# the next line's first word would not have fitted after it. A line that ends a sentence or a record (".", "!",
# "?", ";", a closing bracket) is whole, and a line that opens a record of its own (a level, a stamp, a
# traceback, a frame, an exception) or is indented starts one.
_WHOLE_END = re.compile(r"[.!?;|]\s*$")
WORD_SLACK = 16  # a wrapped line is at most this much shorter than the width (the longest word rich moves down)
WORD_WRAPS = 1  # wraps a log must show before its lines are joined at a width


def _word_continues(cur: str, nxt: str, width: int) -> bool:
    """Is ``nxt`` the rest of ``cur``, wrapped by a console at a blank before ``width``?"""
    if not nxt or nxt[0].isspace() or not cur.strip() or len(cur) > width or len(cur) < width - WORD_SLACK:
        return False
    if cur[-1].isspace() or _WHOLE_END.search(cur) or _OWN_HEADER.match(nxt) or _RULE.match(nxt):
        return False
    if "|" in nxt[:100] and _SERVICE.match(nxt):
        return False  # a compose service's column opens a record
    word = nxt.split(None, 1)[0]
    return len(cur) + 1 + len(word) > width


# a record's level in a column of its own at the line's start, the way a console logger (rich's, uvicorn's) writes
# it: "ERROR:    ", "INFO:     ", after the logger's own stamp or not
_LEVEL_COLUMN = re.compile(
    r"^(?:\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)? )?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|TRACE)"
    r"(?::? {2,}|:(?: |$))"
)
LEVEL_SHARE = 0.5  # of non-empty lines that open with a level column, for a log to be a console logger's


def _word_wrap_width(texts: list[str]) -> int | None:
    """The width a console logger wrapped its records at by words: in a log whose records open with a level column
    (a line without one is a wrapped rest, a traceback's line or a line of its own), the longest line, with at least
    WORD_WRAPS lines just short of it each followed by a line whose first word would not have fitted."""
    lines = [t for t in texts if t.strip()]
    if len(lines) < 3 or sum(1 for t in lines[:400] if _LEVEL_COLUMN.match(t)) < LEVEL_SHARE * len(lines[:400]):
        return None
    width = max((len(t) for t in texts), default=0)
    if width < 60 or width > 300:
        return None
    wraps = sum(1 for a, b in zip(texts, texts[1:]) if _word_continues(a, b, width))
    return width if wraps >= WORD_WRAPS else None


# a cut that lands inside a hex id (a request id, a hash): the rest, "f81b0bfd2d1: ...", is no host prefix
_HEX_TAIL = re.compile(r"[0-9a-f]{4,}$")
_HEX_HEAD = re.compile(r"[0-9a-f]+: ")


def _continues(cur: str, nxt: str, first: str, width: int) -> bool:
    """Is ``nxt`` the rest of ``cur``, cut at the terminal's width?"""
    return (
        len(cur) == width
        and _cut(cur)
        and bool(nxt.strip())
        and (not _OWN_HEADER.match(nxt) or bool(_HEX_TAIL.search(cur) and _HEX_HEAD.match(nxt)))
        and _head(nxt) != _head(first)  # a new record of the same template
        and not _RULE.match(nxt)
    )
