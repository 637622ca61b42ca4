"""The staged narrowing funnel, as one POSIX sh script that runs where the log is.

The seeds' manual funnel is four ssh calls: ``tail -40``, a keyword grep, a
worker grep, a PID-targeted grep. Here the four stages run in one script, so
a host costs one exec round trip, and each stage computes what the next one
needs on the remote side:

1. tail: the last lines of the log, with its size, mtime and inode.
2. keyword grep: error-shaped lines of the latest run (a ``grep -E`` pass
   over the end of the file, cut at the last run-start banner). It reads the
   last 1 MiB, then 8, then 64 (``scan_bytes`` is the cap) and stops at the
   first window that holds a run start, so a 1 GiB log costs what its last
   run costs.
3. worker grep: the process tags that own those lines, earliest first.
4. tag-targeted grep: for the earliest failing tags, every line of theirs
   (and their unprefixed continuation lines) from their first error on, so
   the whole traceback and its final exception line arrive.

The script only reads: no temp files, ``renice``/``ionice -c3`` on itself,
``timeout`` around each pass where available. Every value from the inventory
reaches it as a single-quoted shell assignment. Nothing is cut silently:
caps are in bytes and leave a marker line, and over-long lines keep both ends.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import subprocess
from dataclasses import dataclass, field

from .. import remote
from ..records import FunnelResult, Line

VERSION = 1
DISCOVER_UNDER_ENV = "FLEETDIAG_DISCOVER_UNDER"


@dataclass
class FunnelSpec:
    """What to look for and how much to bring back (all caps are visible)."""

    log: str  # path or glob; the newest match wins
    keywords: str  # one ERE: error-shaped lines
    run_start: str  # one ERE: a new run's start banner
    tags: str  # one ERE: a leading process tag
    # one ERE: a line that opens an error whose message follows it; an untagged log's context pass starts at the
    # first one ("": at a Python traceback's head only)
    block_heads: str = ""
    tail_lines: int = 80
    tail_bytes: int = 32 * 1024
    scan_bytes: int = 64 * 1024 * 1024
    # The keyword pass reads backwards in windows growing 8x from this size (up to scan_bytes) and
    # stops at the first that holds a run start: the result is that of scanning all of scan_bytes.
    first_window: int = 1024 * 1024
    max_line: int = 4096
    hits_head: int = 400
    hits_tail: int = 200
    hit_bytes: int = 192 * 1024
    ntags: int = 6
    window_bytes: int = 1024 * 1024
    context_lines: int = 400
    timeout: int = 30  # seconds, per pass, on the remote side
    # seconds a ``command`` source may run (it is read once and must end): below the exec's own timeout,
    # so a command that does not end is reported as such, not cut with the whole answer
    command_timeout: int = 30
    # The head pass: lines naming the job's rendezvous (one ERE, ``fleetdiag.job.endpoint_ere``; ""
    # skips it), at most ``head_lines`` of them in the first ``head_bytes`` of the latest run.
    endpoints: str = ""
    head_bytes: int = 64 * 1024
    head_lines: int = 4
    extra: str = ""  # more script (facts), appended before the end marker
    # Self-contained script (reads only exported FD_* values) that runs beside the funnel, from
    # the start: its output, held in the pipe, follows ``extra``'s. The kernel part: its
    # journalctl and nvidia-smi calls cost as much as the funnel on a GPU host.
    side: str = ""
    last: str = ""  # after everything else, right before the end marker (the remote clock)
    extra_vars: dict[str, str] = field(default_factory=dict)
    # Where the log is (remote/discover.sh): file (``log``), journal/docker/command (``source_value``),
    # or discover (find the job's process, then its log). ``fallback``: a missing file log is
    # replaced by the log of a running framework process; ``globs``: a dead job's logs.
    source: str = "file"
    source_value: str = ""
    fallback: bool = False
    globs: list[str] = field(default_factory=list)
    stream_bytes: int = 16 * 1024 * 1024  # a stream is read once: its last N bytes
    stream_lines: int = 200000  # journalctl -n / docker logs --tail
    path_prepend: str = ""  # a remote dir before PATH (journalctl, docker, scontrol in odd places)
    docker_root: str = "/var/lib/docker"  # where a container's json-file log is, when docker logs is refused
    k8s_logs: str = "/var/log/containers"  # the kubelet's CRI logs (POD_NS_CONTAINER-ID.log)
    # Discovery considers only the descendants of this pid on the host ("": every process). From
    # $FLEETDIAG_DISCOVER_UNDER: the tests' sshd is this machine, whose other processes are not theirs.
    discover_under: str = field(default_factory=lambda: os.environ.get(DISCOVER_UNDER_ENV, "").strip())
    nice: bool = True  # lowest CPU and I/O priority (a host's own work comes first); off for a local analyze


# The script body (remote/funnel.sh). Values arrive as shell variables set above it;
# awk reads regexes through ENVIRON so no escape processing touches them.
_PRELUDE = remote.load("prelude.sh")
_BODY = remote.load("funnel.sh")
_END = remote.load("end.sh")
_SOURCE = remote.load("discover.sh")
# Process names (argv[0] or python's script) and python -m modules that are a job; modules that are not.
JOBS_ERE = "^(vllm|sglang|torchrun|deepspeed|ray|accelerate)$"
JOB_MODULES_ERE = r"^(vllm|sglang|torch\.distributed|deepspeed|ray|accelerate)([.]|$)"
NOT_JOBS_ERE = r"^(pytest|pip|venv|ensurepip|http\.server|json\.tool|ipykernel.*|jupyter.*|notebook|fleetdiag.*|mypy|ruff|black|pydoc|unittest|timeit|cProfile|pdb|idlelib|site|asyncio|tkinter)([.]|$)"


def _q(value: object) -> str:
    return remote.quote(value)


def build_script(spec: FunnelSpec, mark: str) -> str:
    """The complete script: quoted assignments, then the fixed body."""
    env = {
        "FD_MARK": mark,
        "FD_NICE": "1" if spec.nice else "",
        "FD_VERSION": VERSION,
        "FD_LOG": spec.log,
        "FD_KW": spec.keywords,
        "FD_RS": spec.run_start,
        "FD_TAGS": spec.tags,
        "FD_BH": spec.block_heads or r"Traceback \(most recent call last\)",
        "FD_TL": spec.tail_lines,
        "FD_TB": spec.tail_bytes,
        "FD_SCAN": spec.scan_bytes,
        "FD_W0": spec.first_window,
        "FD_MAXLINE": spec.max_line,
        "FD_H1": spec.hits_head,
        "FD_H2": spec.hits_tail,
        "FD_HB": spec.hit_bytes,
        "FD_NTAGS": spec.ntags,
        "FD_WIN": spec.window_bytes,
        "FD_CTX": spec.context_lines,
        "FD_TMO": spec.timeout,
        "FD_CTMO": max(1, min(spec.timeout, spec.command_timeout)),
        "FD_EP": spec.endpoints,
        "FD_HEADB": spec.head_bytes,
        "FD_HEADN": spec.head_lines,
        "FD_SRC": spec.source,
        "FD_SRCV": spec.source_value,
        "FD_FALLBACK": "1" if spec.fallback else "",
        "FD_GLOBS": "\n".join(spec.globs),
        "FD_LOGLIT": "",
        "FD_SBYTES": spec.stream_bytes,
        "FD_SLINES": spec.stream_lines,
        "FD_DPATH": spec.path_prepend,
        "FD_DOCKER_ROOT": spec.docker_root,
        "FD_K8S_LOGS": spec.k8s_logs,
        "FD_UNDER": spec.discover_under if spec.discover_under.isdigit() else "",
        "FD_JOBS": JOBS_ERE,
        "FD_JOBMODS": JOB_MODULES_ERE,
        "FD_NOTJOBS": NOT_JOBS_ERE,
        **spec.extra_vars,
    }
    if not spec.side:
        return remote.script(env, _PRELUDE, _BODY, _SOURCE, spec.extra, spec.last, _END)
    # the end marker inside the group, right after what it holds last (remote/end.sh writes both at once):
    # the side's output is all in once ``cat`` has read its pipe to the end
    return remote.script(
        env, _PRELUDE, "{\n", spec.side, "} | {\n", _BODY, _SOURCE, spec.extra, "cat\n", spec.last, _END, "}\n"
    )


def new_mark() -> str:
    return "@@FD:" + secrets.token_hex(6)


def remote_command(script: str) -> str:
    """The exec request: a fixed, value-free wrapper safe under every login shell (csh and fish
    too), with the script as base64 data that only ``sh`` decodes. See ``fleetdiag.remote``."""
    return remote.remote_command(script)


_LINE_SPLIT = re.compile("\t")
NODE_RECORDS = 200_000  # remote/node.sh's records kept (its files are bounded there; this bounds the rest)
CUT = "funnel output ended early (timeout or connection cut): what arrived is shown"


def parse_output(out: str, mark: str) -> FunnelResult:
    """Turn the script's tagged lines into a FunnelResult.

    Anything before the begin marker (a login banner, a chatty ``.bashrc``)
    is ignored. A missing end marker means the output was cut short, and says so.
    """
    res = FunnelResult(payload_bytes=len(out.encode("utf-8", "surrogateescape")))
    begin = out.find(mark + " begin")
    if begin < 0:
        res.status = "error"
        if not out.strip():
            res.markers.append("the remote command printed nothing")
        else:
            res.markers.append("the remote shell did not run the funnel (is sh and awk on the login PATH?)")
            res.facts["reason"] = "it printed: " + _first_words(out)
        return res
    body = out[begin:].split("\n")
    if not out.endswith("\n") and len(body) > 1 and not body[-1].startswith(mark):
        body.pop()  # cut mid-line (timeout, dropped connection): never analyse half a record
        res.markers.append("the last line arrived cut and was dropped")
    section = ""
    target: list[Line] = res.hits
    ended = False
    for raw in body[1:]:
        if raw.startswith(mark):
            if raw == mark + " end":
                ended = True
                break  # anything after the end (a logout script's chatter) is not ours
            continue
        kind, _, rest = raw.partition("\t")
        if kind == "L":
            pos, _, rest = rest.partition("\t")
            lno, _, text = rest.partition("\t")
            try:
                ln = Line(int(pos), text, int(lno) if lno.isdigit() else None)
            except ValueError:
                continue
            target.append(ln)
        elif kind == "S":
            section = rest
            if section == "tail":
                target = res.tail
            elif section == "hits":
                target = res.hits
            else:
                target = res.context
        elif kind == "M":
            key, _, value = rest.partition("\t")
            _meta(res, key, value)
        elif kind == "T":
            parts = rest.split("\t", 2)
            if len(parts) == 3:
                res.tags.append(parts[2])
        elif kind == "X":
            res.markers.append(rest)
        elif kind == "F":
            key, _, value = rest.partition("\t")
            res.facts.setdefault("raw", {}).setdefault(key, []).append(value)
        elif kind == "N":  # what the node knows about the job (remote/node.sh), parsed by facts.node
            node = res.facts.setdefault("node_raw", [])
            if len(node) < NODE_RECORDS:
                node.append(rest)
        elif kind == "K":  # kernel evidence (remote/kernel.sh), one of its lines per record
            res.kernel.append(rest)
    if not ended:
        res.markers.append(CUT)
    return res


def _meta(res: FunnelResult, key: str, value: str) -> None:
    ints = {"size": "size", "inode": "inode", "window": "window_start", "run_start": "run_start"}
    if key in ints:
        try:
            setattr(res, ints[key], int(value))
        except ValueError:
            pass
    elif key in ("mtime", "now"):
        try:
            setattr(res, key, float(value))
        except ValueError:
            pass
    elif key == "status":
        res.status = value
    elif key == "pathhex":
        try:
            res.path = bytes.fromhex(value).decode("utf-8", "backslashreplace")
        except ValueError:
            res.path = None
    elif key == "reason":
        res.facts["reason"] = value
    elif key in ("src_kind", "src_detailhex", "src_byhex"):
        name = {"src_kind": "kind", "src_detailhex": "detail", "src_byhex": "found_by"}[key]
        if key != "src_kind":
            try:
                value = bytes.fromhex(value).decode("utf-8", "backslashreplace")
            except ValueError:
                value = ""
        res.facts.setdefault("log_source", {})[name] = value
    elif key == "deniedhex":
        try:
            where = bytes.fromhex(value).decode("utf-8", "backslashreplace")
        except ValueError:
            where = "a parent directory"
        res.facts["reason"] = f"permission denied: cannot enter {where}"
    elif key == "note":
        res.markers.append(value)
    else:
        res.facts.setdefault("remote", {})[key] = value


def shell_failure(stderr: bytes, status: int | None) -> str:
    """Why the remote shell did not run the funnel, from its exit status and stderr."""
    said = _first_words(stderr.decode("utf-8", "replace"))
    hint = {127: "sh not found", 126: "sh not executable"}.get(status or 0, "")
    bits = [b for b in (f"exit status {status}" if status is not None else "", hint, said) if b]
    return ": ".join(bits) if bits else "no output and no error message"


def _first_words(out: str) -> str:
    text = " ".join(out.split())
    return text[:200]


def local_script(spec: FunnelSpec, mark: str | None = None) -> tuple[str, str]:
    """The script ``run_local`` runs for ``spec``, and its marker (``mark``, else a new one)."""
    mark = mark or new_mark()
    return build_script(dataclasses.replace(spec, nice=False), mark), mark  # the user waits: no lowered priority


def run_script(script: str, timeout: float | None = None) -> bytes:
    """A funnel script through the local ``sh``: its stdout."""
    return subprocess.run(["sh", "-c", script], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout).stdout


def run_local(spec: FunnelSpec, timeout: float | None = None) -> FunnelResult:
    """Run the same script through the local ``sh``: ``fleetdiag analyze`` uses grep speed too."""
    script, mark = local_script(spec)
    return parse_output(run_script(script, timeout).decode("utf-8", "replace"), mark)
