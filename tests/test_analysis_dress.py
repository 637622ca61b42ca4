"""Class 5 (#22): the same real log in another dress gets the same answer.

Every failed case of tests/corpus and tests/corpus_extra is re-dressed the
way log services and terminals deliver logs (CRLF; exported newest-first
with the service's timestamp and severity before every line, tab- or
table-separated; re-wrapped at a terminal's width) and must keep its
decisive line: one normalisation step (analysis/normalise.py) undoes each.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from fleetdiag.analysis import analyze_text, load_rules
from fleetdiag.analysis.lines import split_text
from fleetdiag.analysis.normalise import normalise
from fleetdiag.records import Line

ROOT = Path(__file__).resolve().parent


def _line_known_wrong(label: dict) -> bool:
    """The undressed log's decisive line is a known miss (its ``known_wrong``): no dress can keep it."""
    why = label.get("known_wrong")
    return bool(why) and (not isinstance(why, dict) or "test_decisive_line" in why)


CASES = [
    p
    for d in ("corpus", "corpus_extra")
    for p in sorted((ROOT / d).glob("*.json"))
    if json.loads(p.read_text()).get("verdict", "failed") == "failed"
    and not _line_known_wrong(json.loads(p.read_text()))
]


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def export_newest_first(text: str) -> str:
    """A log service's download: newest first, "<time>\\t<SEVERITY>\\t<line>"."""
    lines = text.rstrip("\n").split("\n")
    out = []
    for i, ln in enumerate(lines):
        t = f"2026-12-01T10:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z"
        out.append(f"{t}\t{'ERROR' if 'rror' in ln else 'INFO'}\t{ln}")
    return "\n".join(reversed(out)) + "\n"


def console_table(text: str) -> str:
    """A console's table copy: "  | <time> | <line>", oldest first."""
    lines = text.rstrip("\n").split("\n")
    return (
        "\n".join(f"  | 2026-12-01T10:{i // 60 % 60:02d}:{i % 60:02d}.000Z | {ln}" for i, ln in enumerate(lines)) + "\n"
    )


def wrapped(text: str, width: int = 100) -> str:
    """A terminal's copy: every long line cut at the terminal's width (a markdown fence glued to the paste's first
    line was typed after the copy, so it is not part of the width)."""
    out = []
    fence = "```" if text.startswith("```") and not text.startswith("```\n") else ""
    for ln in text[len(fence) :].rstrip("\n").split("\n"):
        ln = ln.rstrip()
        while len(ln) > width:
            out.append(ln[:width])
            ln = ln[width:]
        out.append(ln)
    return fence + "\n".join(out) + "\n"


def sidecar_label(text: str) -> str:
    """A sidecar's relay: its own "[name]: " label before every line (blank lines keep the bare label)."""
    return "".join(f"[VllmSidecar pod-7d4b9c-xk2p]: {ln}".rstrip(" ") + "\n" for ln in text.rstrip("\n").split("\n"))


def kubectl_prefix(text: str) -> str:
    """``kubectl logs --prefix``: "[pod/<pod>/<container>] " before every line."""
    return "".join(f"[pod/vllm-0/vllm] {ln}\n" for ln in text.rstrip("\n").split("\n"))


def markdown_reply(text: str) -> str:
    """A log pasted into an issue and then quoted in a reply: "> " before a <details> block, a fence, the lines."""
    body = ["<details>", "<summary>Logs</summary>", "", "```text", *text.rstrip("\n").split("\n"), "```", "</details>"]
    return "".join(f"> {ln}".rstrip(" ") + "\n" for ln in body)


def front_end_relay(text: str) -> str:
    """A desktop front-end's relay of its child: its stamp, "[Info]" (whatever the line says) and component."""
    return "".join(
        f"2026-05-08 11:{i // 60 % 60:02d}:{i % 60:02d}.093 [Info] (Process) {ln}\n"
        for i, ln in enumerate(text.rstrip("\n").split("\n"))
    )


def word_label(text: str) -> str:
    """A launcher's "SUBPROCESS: " before every line of the worker it runs."""
    return "".join(f"SUBPROCESS: {ln}".rstrip(" ") + "\n" for ln in text.rstrip("\n").split("\n"))


def _stamped(stamp) -> object:
    return lambda text: "".join(f"{stamp(i)}{ln}\n" for i, ln in enumerate(text.rstrip("\n").split("\n")))


# CI runners' stamps before every line of a job's output: Buildkite's "[<ISO>Z] ", Taskcluster's "[task <ISO>Z] ",
# GitHub Actions' "<ISO with 7 digits>Z ", Jenkins' timestamper clock "HH:MM:SS "
buildkite = _stamped(lambda i: f"[2025-05-19T12:{i // 60 % 60:02d}:{i % 60:02d}Z] ")
taskcluster = _stamped(lambda i: f"[task 2024-05-16T19:{i // 60 % 60:02d}:{i % 60:02d}.420Z] ")
github_actions = _stamped(lambda i: f"2024-05-01T12:{i // 60 % 60:02d}:{i % 60:02d}.1234567Z ")
jenkins_clock = _stamped(lambda i: f"12:{i // 60 % 60:02d}:{i % 60:02d} ")


DRESSES = {
    "buildkite": buildkite,
    "taskcluster": taskcluster,
    "github-actions": github_actions,
    "jenkins-clock": jenkins_clock,
    "crlf": crlf,
    "export-newest-first": export_newest_first,
    "console-table": console_table,
    "wrapped": wrapped,
    "sidecar-label": sidecar_label,
    "kubectl-prefix": kubectl_prefix,
    "markdown-reply": markdown_reply,
    "front-end-relay": front_end_relay,
    "word-label": word_label,
}


@pytest.fixture(scope="module")
def rules():
    return load_rules(user_default=False)


def _squash(s: str) -> str:
    return "".join(s.split())


@pytest.mark.parametrize("dress", sorted(DRESSES))
def test_dressed_corpus_keeps_its_decisive_line(dress, rules):
    wrong = _changed_in(dress, DRESSES[dress], rules)
    assert not wrong, f"{len(wrong)}/{len(CASES)} cases changed in dress {dress}: {wrong}"


def _changed_in(dress, redress, rules) -> list:
    wrong = []
    for p in CASES:
        label = json.loads(p.read_text())
        text = p.with_suffix(".log").read_text(encoding="utf-8", errors="replace")
        if dress == "wrapped" and sum(1 for ln in text.split("\n") if len(ln.rstrip()) > 100) < 2:
            continue  # one cut line is indistinguishable from a line that long
        if dress not in ("crlf", "wrapped") and sum(1 for ln in text.split("\n") if ln.strip()) < 3:
            continue  # a prefix on one or two lines is indistinguishable from their own text (normalise needs three)
        steps = normalise(split_text(text)).steps
        if dress in ("console-table", "export-newest-first") and "log viewer's line chrome removed" in steps:
            continue  # a viewer's copy is what a user pastes: no log service exports it again (two layers)
        if dress != "crlf" and "newest-first order reversed" in steps:
            continue  # already an export (journalctl -r): a second dress over it is two layers, one is undone
        if dress == "wrapped" and "service prefix removed" in steps:
            continue  # a stamp on every record, cut lines without it: the stamp is on too few lines to be dress
        if (
            dress in ("buildkite", "taskcluster", "github-actions", "jenkins-clock")
            and "service prefix removed" in steps
        ):
            continue  # already behind a runner's stamp: a second stamp over it is two layers, one is undone
        if dress in ("front-end-relay", "word-label") and steps:
            continue  # a relay around a log in a whole-log dress of its own (a label, markdown): two layers
        plain = analyze_text(text, rules=rules).decisive
        dressed = redress(text)
        dec = analyze_text(dressed, rules=rules).decisive
        accepted = [label["decisive"], *label.get("decisive_alt", [])]
        # ``line`` is the file's line (a terminal-cut line's first part): the logical line goes on after it
        phys = dressed.split("\n")
        said = "".join(phys[dec.lineno - 1 : dec.lineno + 40]) if dec is not None and dec.lineno else ""
        # (a part of it, when the line relays a message unfolded into lines of its own, or a progress bar was split
        # off its start)
        parted = {"relayed message unfolded", "progress bar split from the line glued to it"} & set(steps)
        relayed = bool(parted) and dec is not None and dec.lineno
        line = dec.line if dec is not None else ""
        ok = dec is not None and (
            _squash(said).startswith(_squash(line)) or bool(relayed) and _squash(line) in _squash(said)
        )
        ok = ok and any(_squash(a) in _squash(said) for a in accepted)
        ok = ok and not any(_squash(d) in _squash(dec.line) for d in label.get("decoys", []))
        ok = ok and dec.category == plain.category
        if not ok:
            wrong.append((p.stem, dec.line[:120] if dec else None))
    return wrong


def test_normalise_maps_lines_back():
    text = export_newest_first(
        "a first line\nTraceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'k'\n"
    )
    lines = split_text(text)
    norm = normalise(lines)
    assert "newest-first order reversed" in norm.steps and "service prefix removed" in norm.steps
    assert [ln.text for ln in norm.lines][-1] == "KeyError: 'k'"
    assert norm.original(norm.lines[-1].pos).lineno == 1  # the newest line is the file's first


def test_a_constant_line_label_goes_a_varying_one_stays():
    text = "[web-1] INFO starting\n[web-1] ERROR boom\n[web-1]\n[web-1] INFO done\n"
    norm = normalise(split_text(text))
    assert norm.steps == ["line label removed"]
    assert [ln.text for ln in norm.lines] == ["INFO starting", "ERROR boom", "", "INFO done"]
    mixed = "[web-1] INFO a\n[web-2] ERROR b\n[web-1] INFO c\n[web-2] INFO d\n"
    assert "line label removed" not in normalise(split_text(mixed)).steps
    ranks = "[rank0]: x\n[rank0]: y\n[rank0]: z\n"
    assert normalise(split_text(ranks)).steps == []


def test_plain_logs_are_left_alone():
    for p in CASES[:20]:
        lines = split_text(p.with_suffix(".log").read_text(encoding="utf-8", errors="replace"))
        norm = normalise(lines)
        assert norm.lines == lines or norm.steps


def test_a_removed_prefix_keeps_the_year_a_klog_stamp_lacks() -> None:
    """A container runtime's ISO stamp before a klog line ('I0809 13:32:51') is the line's time once the
    prefix is removed: the klog stamp has no year, and a year guessed from today misplaces the failure
    against the kernel log (the shared kernel case akash244 is such a log)."""
    log = "".join(
        f"2024-08-09T13:32:{s:02d}.873588972Z I0809 13:32:{s:02d}.873541       1 health.go:185] step {s}\n"
        for s in range(10, 40)
    )
    log += (
        "2024-08-09T13:32:51.873588972Z E0809 13:32:51.873541       1 health.go:190] "
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    d = analyze_text(log, rules=load_rules(user_default=False))
    assert d.decisive is not None
    assert d.decisive.time == "2024-08-09T13:32:51.873588972Z"
    plain = analyze_text(log.replace("2024-08-09T13:32:51.873588972Z ", ""), rules=load_rules(user_default=False))
    assert plain.decisive is not None and plain.decisive.time.startswith("0809 13:32:51")


def test_a_collectors_stream_marker_and_a_runners_labels_go_with_the_stamp() -> None:
    """What a collector or job runner puts between its stamp and the program's line carries no meaning of its
    own: CRI's ``stdout F``, a sidecar's ``1 stdout:``, a runner's ``[step/task (pid N)] [run id]`` labels."""
    rules = load_rules(user_default=False)
    cri = "".join(f"2024-05-01T10:00:0{s}.1Z stderr F INFO step {s}\n" for s in range(5))
    cri += "2024-05-01T10:00:06.1Z stderr F RuntimeError: CUDA error: an illegal memory access was encountered\n"
    sidecar = "".join(f"[Side a1]: 2024-05-01T10:00:0{s}.1Z 1 stdout: INFO step {s}\n" for s in range(5))
    sidecar += "[Side a1]: 2024-05-01T10:00:06.1Z 1 stdout: CRITICAL 05-01 10:00:06 launcher.py:99] boom\n"
    runner = "".join(f"2024-05-01 10:00:0{s}.1 [7/train/9 (pid 4)] [0c1-ab] INFO step {s}\n" for s in range(5))
    runner += "2024-05-01 10:00:06.1 [7/train/9 (pid 4)] [0c1-ab] OSError: [Errno 28] No space left on device\n"
    for log, line, kind in (
        (cri, "RuntimeError: CUDA error: an illegal memory access was encountered", "RuntimeError"),
        (sidecar, "CRITICAL 05-01 10:00:06 launcher.py:99] boom", None),
        (runner, "OSError: [Errno 28] No space left on device", "OSError"),
    ):
        norm = normalise(split_text(log))
        assert norm.lines[-1].text == line, norm.steps
        if kind is not None:
            d = analyze_text(log, rules=rules)
            assert d.decisive is not None and d.decisive.exception_type == kind
    # a clock in brackets is the program's own stamp, not a label, even when it is the same on every line
    same_second = "".join(f"[10:00:06] step {s}\n" for s in range(5))
    assert normalise(split_text(same_second)).steps == []


def test_one_record_repeated_at_the_widest_length_is_not_a_terminals_wrap() -> None:
    """Lines of one template that differ only in their stamps all have one length: that is not a terminal's width
    (a supervisor relaying one worker error per rank, as in the held-back dynamo case)."""
    rec = "2025-04-23T03:35:4{s}.39{s}Z  INFO worker: VLLM: Failed: /w/csrc/ar.cuh:368 'invalid argument'\n"
    log = "also reduce the `max_num_seqs` as needed.\n" + "".join(rec.format(s=s) for s in range(4))
    log += "Capturing CUDA graph shapes: 100%|██████████| 35/35\n" + "".join(rec.format(s=s) for s in range(4, 7))
    assert normalise(split_text(log)).steps == []


def test_a_list_of_records_as_wide_as_the_widest_line_is_not_a_terminals_wrap() -> None:
    """A tool's list of devices ("GPU 0: <name> (UUID: GPU-…)") has lines of one width, the widest in the log: a
    list whose every row is followed by its next row is no terminal's cuts, so the error after the list stays a
    line of its own (gpu-burn's, as in tests/corpus_extra's gpu-burn #127)."""
    gpus = "".join(
        f"GPU {n}: NVIDIA A100-SXM4-80GB (UUID: GPU-{n}4f912ca-9155-19aa-e4d5-6361a6ddbfe{n})\n" for n in range(4)
    )
    err = "Couldn't init CUDA: Error (gpu_burn-drv.cpp:304): system not yet initialized\n"
    log = "Burning for 120 seconds.\n" + gpus + err + "No CUDA devices\n"
    assert normalise(split_text(log)).steps == []
    d = analyze_text(log)
    assert d.verdict == "failed" and d.decisive is not None
    assert d.decisive.line == err.strip() and d.decisive.rule == "cuda-system-not-ready"


def test_a_terminal_cut_inside_a_hex_id_is_joined_and_a_host_prefix_is_not(rules) -> None:
    """A cut at the terminal's width that lands inside a request id leaves "f81b0bfd2d1: ..." on the next line: the
    rest of the id, not a host's prefix. A line that starts with a host's name after a full-width line stays its own."""
    lines = [
        "ERROR 12-16 09:17:04 [async_llm.py:480] Traceback (most recent call last):",
        '  File "/srv/lib/python3.12/site-packages/vllm/v1/engine/core_client.py", line 846, in get_output_as',
        "ync",
        "ERROR 12-16 09:17:04 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encoun",
        "tered an issue. See stack trace (above) for the root cause.",
    ]
    width = len(lines[1])
    failed = "ERROR 12-16 09:17:04 [stage.py:1000] Failed on request chatcmpl-" + "533c3c01506d4618b3e03f81b0bfd2d1" * 2
    lines += [failed[:width], failed[width:] + ": EngineCore encountered an issue."]
    assert len(lines[3]) == width == len(lines[5]) and lines[6].split(":")[0].isalnum() and len(lines[6]) < width
    norm = normalise(split_text("\n".join(lines) + "\n"))
    assert f"lines re-wrapped at {width} columns joined" in norm.steps, norm.steps
    assert any(ln.text == failed + ": EngineCore encountered an issue." for ln in norm.lines)
    d = analyze_text("\n".join(lines) + "\n", rules=rules)
    assert d.decisive is not None and d.decisive.exception_type == "vllm.v1.engine.exceptions.EngineDeadError"
    # a host's line after a full-width line that ends in a word is the host's, not the rest of that word
    host = ["x" * (width - 7) + " deadbe", "node-12: RuntimeError: boom"]
    norm = normalise(split_text("\n".join(lines[:5] + host) + "\n"))
    assert any(ln.text == "node-12: RuntimeError: boom" for ln in norm.lines)


def test_a_pastes_markdown_comes_off_and_a_log_lines_own_marks_stay() -> None:
    """Fences (glued to a line too), quotes, inline code, <details> tags, a bullet and a user's elision are dress;
    a logger's "- name - LEVEL - ", pytest's "> " marker and backticks inside a message are the line's own."""
    from fleetdiag.analysis.normalise import undress

    assert undress("```common_init_from_params: warming up") == "common_init_from_params: warming up"
    assert undress("[Inferior 1 (process 35621) detached]```") == "[Inferior 1 (process 35621) detached]"
    assert undress("> > RuntimeError: boom") == "RuntimeError: boom"
    assert undress("`RuntimeError: set a smaller `--max-running-requests`. n=2,") == (
        "RuntimeError: set a smaller `--max-running-requests`. n=2,"
    )
    assert (
        undress("`torch.cuda.OutOfMemoryError: CUDA out of memory.`")
        == "torch.cuda.OutOfMemoryError: CUDA out of memory."
    )
    assert undress("- RuntimeError: CUDA error: out of memory") == "RuntimeError: CUDA error: out of memory"
    for dress in (
        "```",
        "```python",
        "~~~",
        "`",
        "<details>",
        "</details>",
        "<summary>Logs</summary>",
        "...",
        "[...]",
        "<snip>",
        "    …",
    ):
        assert undress(dress) is None, dress
    for own in (
        "- vllm.engine - ERROR - boom",
        "a `b` c",
        "[rank0]: Traceback (most recent call last):",
        " > 0) failed",  # the rest of a line a paste cut, not a quote
        "               ~~~~~^^^^^^^^^^",  # carets under a Python 3.11+ frame, not a fence
        "    ^^^^^^^^~~~~~",
        "*" * 50,  # a separator, not bold
        "plain",
    ):
        assert undress(own) == own
    assert undress(">       assert x == 2") == "      assert x == 2"  # pytest's marker: the code stays


def test_an_elision_inside_a_quoted_traceback_keeps_it_one_traceback(rules) -> None:
    text = (
        "> Traceback (most recent call last):\n"
        '>   File "serve.py", line 3, in <module>\n'
        "> ...\n"
        '>   File "model.py", line 9, in load\n'
        "> torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "`\n"
    )
    d = analyze_text(text, rules=rules)
    assert d.decisive is not None and d.decisive.exception_type == "torch.OutOfMemoryError"
    assert d.decisive.lineno == 5 and d.decisive.line.startswith("> torch.OutOfMemoryError")
    assert "markdown removed" in d.decisive.reason


def test_a_front_ends_level_counts_and_its_info_hides_nothing(rules) -> None:
    from fleetdiag.analysis.lines import parse_line
    from fleetdiag.records import Line

    err = parse_line(0, Line(0, "2026-05-08 11:42:09.093 [Error] (Process) HIP out of memory", 1))
    assert (err.level, err.process, err.msg) == ("ERROR", "Process", "HIP out of memory")
    child = parse_line(0, Line(0, "2026-09-10 21:30:06.005 [Info] (Process) 0.03.453.294 W load_hparams: x", 1))
    assert (child.level, child.msg) == ("WARNING", "load_hparams: x")  # the child's own level letter
    info = parse_line(0, Line(0, "2026-09-10 21:30:06.005 [Info] (Server) POST /api/v1/load", 1))
    assert info.level is None and info.relayed
    journal = "Apr 27 09:35:17  lemond[17105]: 2026-04-27 09:35:17.908 [Error] (Process) HIP out of memory"
    jl = parse_line(0, Line(0, journal, 1))
    assert (jl.tags, jl.level, jl.msg) == (("lemond[17105]", "Process"), "ERROR", "HIP out of memory")
    xin = parse_line(
        0, Line(0, "2024-01-18 21:27:53,300 xinference.core.model 35043 ERROR    Model actor is out of memory.", 1)
    )
    assert (xin.level, xin.source, xin.msg) == ("ERROR", "xinference.core.model", "Model actor is out of memory.")
    relayed = "".join(
        f"2026-05-08 11:42:0{k}.093 [Info] (Process) {ln}\n"
        for k, ln in enumerate(["load_tensors: loading", "RuntimeError: CUDA error: out of memory", "[New LWP 7]", "x"])
    )
    d = analyze_text(relayed, rules=rules)
    assert d.verdict == "failed" and d.decisive is not None and d.decisive.category == "oom"


def test_a_relayed_message_is_unfolded_only_when_it_relays_a_log(rules):
    """Escaped newlines unfold a quoted message that relays a log (a traceback, a stack, a library's record); a
    prompt or a config dump with newlines in it stays one line, and one line's parts are bounded."""
    from fleetdiag.analysis.normalise import MAX_UNFOLD, unfold

    body = r'{"error": "Traceback (most recent call last):\n  File \"/app/x.py\", line 3, in f\nValueError: bad\n"}'
    parts = unfold(body)
    assert parts is not None and parts[-2] == "ValueError: bad"
    d = analyze_text(f"INFO: serving\nERROR 01-02 03:04:05 api.py:9] request failed: {body}\n", rules=rules)
    assert d.verdict == "failed" and d.decisive is not None and d.decisive.exception_type == "ValueError"
    assert d.decisive.line == "ValueError: bad"  # the part as the file has it
    prompt = "INFO 01-02 03:04:05 logger.py:37] Received request c1: prompt: 'Fix this:\\nmy code fails\\nthanks'"
    assert unfold(prompt) is None
    long = '"' + '\\n  File \\"a.py\\", line 1, in f' * (MAX_UNFOLD * 3) + '"'
    assert len(unfold(long) or []) <= MAX_UNFOLD + 1


def test_a_ci_runners_stamp_comes_off_and_a_programs_own_stays(rules) -> None:
    """Buildkite's "[<ISO>Z] ", Taskcluster's "[task <ISO>Z] ", GitHub Actions' 7-digit stamp and Jenkins' clock before
    every line are the runner's; the program's own stamp, level and indentation under them are kept. A program's own
    bracketed "[2024-05-01 12:00:00,123] " (no "T", no zone) is not a runner's and stays."""
    body = [
        "[2024-06-17 06:16:05] [data] Loading SentencePiece vocabulary",
        "Traceback (most recent call last):",
        '  File "/app/train.py", line 9, in <module>',
        "    main()",
        "ERROR 05-20 05:24:31 [core.py:1] RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    for stamp in (
        lambda i: f"[2025-05-20T05:24:3{i}Z] ",
        lambda i: f"[task 2024-06-17T06:16:0{i}.737Z] ",
        lambda i: f"2024-05-01T12:00:0{i}.1234567Z ",
        lambda i: f"12:00:0{i} ",
    ):
        log = "".join(f"{stamp(i)}{ln}\n" for i, ln in enumerate(body))
        norm = normalise(split_text(log))
        assert [ln.text for ln in norm.lines] == body, norm.steps
        d = analyze_text(log, rules=rules)
        assert d.decisive is not None and d.decisive.category == "cuda" and d.decisive.lineno == 5
    own = "".join(f"[2024-05-01 12:00:0{i},123] [INFO] [engine.py:{i}] step {i}\n" for i in range(5))
    assert "service prefix removed" not in normalise(split_text(own)).steps


def test_a_stamps_severity_is_the_programs_when_its_own_header_follows() -> None:
    """A collector's stamp then a level: the level is the collector's, unless the program's own header goes on with
    its date after it (vLLM's "ERROR 10-10 14:03:52 [f.py:1] "): then the level is the program's and stays."""
    log = "".join(f"2024-05-01T12:00:0{i}.1Z ERROR 10-10 14:03:5{i} [core.py:9] line {i}\n" for i in range(4))
    assert normalise(split_text(log)).lines[0].text == "ERROR 10-10 14:03:50 [core.py:9] line 0"
    # Ray Serve's "%(levelname)s %(asctime)s" header carries the full date
    ray = "".join(
        f"2024-05-01T12:00:0{i}.1Z ERROR 2024-09-19 08:23:5{i},732 controller 528 -- line {i}\n" for i in range(4)
    )
    assert normalise(split_text(ray)).lines[0].text == "ERROR 2024-09-19 08:23:50,732 controller 528 -- line 0"
    tabbed = "".join(f"2024-05-01T12:00:0{i}.1Z\tERROR\tline {i}\n" for i in range(4))
    assert normalise(split_text(tabbed)).lines[0].text == "line 0"


def test_a_severity_after_a_stamp_on_a_few_lines_is_the_programs(rules) -> None:
    """A CI runner stamps every line; a severity after the stamp on only a few of them is the program's own
    ("…Z [ERROR] Exception …", cuDNN's samples), not a collector's column: it stays, and the line is an error."""
    body = [f"step {i} ok" for i in range(6)] + ["[ERROR] Exception cudnnFinalize failed cudnn_status: NOT_INITIALIZED"]
    log = "".join(f"2024-05-01T12:00:0{i}.1234567Z {ln}\n" for i, ln in enumerate(body))
    assert [ln.text for ln in normalise(split_text(log)).lines] == body
    d = analyze_text(log, rules=rules)
    assert d.verdict == "failed" and d.decisive is not None and d.decisive.lineno == 7
    # on most lines it is the collector's column, and goes
    sev = "".join(f"2024-05-01T12:00:0{i}.1Z [INFO] step {i} ok\n" for i in range(6))
    assert normalise(split_text(sev)).lines[0].text == "step 0 ok"


def test_one_compose_service_is_peeled_and_names_the_process(rules) -> None:
    """One service's column on every line: the column goes and the service is the process of the decisive line; two
    services interleaved keep their columns (each line's tag)."""
    log = (
        "Attaching to app-1\n"
        "app-1  | INFO:     Loading model\n"
        "app-1  | INFO:     Loading tokenizer\n"
        "app-1  | INFO:     Allocating cache\n"
        "app-1  | INFO:     Warming up\n"
        "app-1  |\n"
        "app-1  | terminate called after throwing an instance of 'std::runtime_error'\n"
        "app-1  |   what():  CUDA failed with error out of memory\n"
        "app-1 exited with code 134\n"
    )
    norm = normalise(split_text(log))
    assert norm.service == "app-1" and "service column removed" in norm.steps
    d = analyze_text(log, rules=rules)
    assert d.decisive is not None and d.decisive.process == "app-1" and d.decisive.category == "oom"
    mixed = "web-1  | INFO a\ndb-1   | INFO b\nweb-1  | INFO c\ndb-1   | ERROR d\n"
    assert normalise(split_text(mixed)).service is None


def test_a_rich_console_word_wrap_behind_compose_is_joined(rules) -> None:
    """rich wraps a record at its console's width at the last blank; compose puts its column before each part. The
    parts are one line again (joined at the blank), so the exception's message is whole and gives the category; a
    line that ends a sentence, an indented line and a line of its own (a level, a frame) are never joined."""
    records = [
        "INFO:     Loading model: /app/models/Qwen2.5-Coder-32B-Instruct-exl2 with a manual GPU split",
        "ERROR:    Traceback (most recent call last):",
        'ERROR:      File "/usr/local/lib/python3.10/dist-packages/exllamav2/model.py", line 378, in load',
        "ERROR:    RuntimeError: the requested tensor cannot be placed on the device because CUDA out of "
        "memory. Tried to allocate 260.00 MiB. GPU 1 has a total capacity of 23.53 GiB of which 190.50 MiB is free.",
        "INFO:     Unloading model.",
    ]
    parts = [p for r in records for p in textwrap.wrap(r, 80, replace_whitespace=False, break_on_hyphens=False)]
    assert max(map(len, parts)) <= 80 and len(parts) > len(records)
    log = "".join(f"tabbyapi-1  | {p}\n" for p in parts)
    norm = normalise(split_text(log))
    assert any(s.startswith("lines re-wrapped by words at") for s in norm.steps), norm.steps
    assert [ln.text for ln in norm.lines] == records
    d = analyze_text(log, rules=rules)
    assert d.decisive is not None and d.decisive.category == "oom"
    assert d.decisive.lineno == 1 + parts.index(next(p for p in parts if "RuntimeError" in p))
    assert d.decisive.line.startswith("tabbyapi-1  | ERROR:    RuntimeError:")
    # no console wrapped this: lines of many lengths, none just short of the longest
    plain = "INFO step one of the run is done and the next one starts now\nthe end\n" * 3
    assert not any("by words" in s for s in normalise(split_text(plain)).steps)


def test_a_log_viewers_line_chrome_between_the_lines_is_removed() -> None:
    """Buildkite's viewer copies "Actions for L<n>" and the line's number onto lines of their own between the
    log's lines, GitHub Actions' a link to each line: the traceback under them is one again."""
    body = [
        "[2026-07-18T22:18:03Z] ERROR 07-18 22:18:03 [registry.py:987] Traceback (most recent call last):",
        '[2026-07-18T22:18:03Z] ERROR 07-18 22:18:03 [registry.py:987]   File "/w/registry.py", line 980, in load',
        "[2026-07-18T22:18:03Z] ERROR 07-18 22:18:03 [registry.py:987]     return cls.__module__",
        "[2026-07-18T22:18:03Z] ERROR 07-18 22:18:03 [registry.py:987] AttributeError: 'str' object has no attribute "
        "'__module__'",
    ]
    lines = []
    for n, text in enumerate(body, 309):
        lines += [f"Actions for L{n}", str(n), text]
    d = analyze_text("\n".join(lines) + "\n", rules=load_rules(user_default=False))
    assert d.decisive is not None and d.decisive.line.endswith(
        "AttributeError: 'str' object has no attribute '__module__'"
    )
    assert d.decisive.exception_type == "AttributeError"
    links = "".join(
        f"[{n}](https://github.com/o/r/actions/runs/1/job/2#step:19:{n + 1})\n{t}\n" for n, t in enumerate(body)
    )
    d = analyze_text(links, rules=load_rules(user_default=False))
    assert d.decisive is not None and "AttributeError" in d.decisive.line


def test_numbers_alone_on_a_few_lines_are_the_programs_own() -> None:
    texts = ["step 1 loss 0.5", "42", "step 2 loss 0.4", "step 3 loss 0.3", "step 4 loss 0.2", "RuntimeError: boom"]
    assert not normalise([Line(k, t, k + 1) for k, t in enumerate(texts)]).steps
