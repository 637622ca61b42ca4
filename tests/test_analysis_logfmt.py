"""logfmt records (Go's slog and logrus, go-kit, ollama's server) and Gin's access log (ollama's front end):
their level is the record's, and a front end answering its own listing and management requests is no sign
that the model behind it serves."""

from __future__ import annotations

import pytest

from fleetdiag.analysis import analyze_text, load_rules
from fleetdiag.analysis.decide import access, is_probe
from fleetdiag.analysis.lines import parse_line
from fleetdiag.records import Line


@pytest.fixture(scope="module")
def rules():
    return load_rules(user_default=False)


def _parse(text: str):
    return parse_line(0, Line(0, text, 1))


@pytest.mark.parametrize(
    "text, level, source, msg",
    [
        (
            'time=2025-03-18T23:10:03.934+03:00 level=ERROR source=server.go:449 msg="llama runner terminated"',
            "ERROR",
            "server.go:449",
            'msg="llama runner terminated"',
        ),
        ('level=error ts=2024-01-02T03:04:05.123Z caller=main.go:12 msg="scrape failed"', "ERROR", "main.go:12", None),
        ('time="2024-01-02T03:04:05Z" level=warning msg="slow"', "WARNING", None, 'msg="slow"'),
        ('lvl=eror msg="bad"', "ERROR", None, 'msg="bad"'),
        ('time=2024-08-26T09:53:44.346Z level=INFO source=sched.go:451 msg="loading"', "INFO", "sched.go:451", None),
    ],
)
def test_a_logfmt_header_gives_the_records_level_and_source(text, level, source, msg) -> None:
    ln = _parse(text)
    assert ln.level == level
    assert ln.source == source
    if msg is not None:
        assert ln.msg == msg
    assert "level=" not in ln.msg


@pytest.mark.parametrize("text", ["timeout waiting for the server", "level 3 reached", "time=42 is not a header"])
def test_prose_that_starts_like_a_key_is_not_a_header(text) -> None:
    ln = _parse(text)
    assert ln.level is None and ln.msg == text


def test_the_access_log_forms_and_what_a_front_end_answers_itself() -> None:
    uvicorn = 'INFO:     10.0.0.1:5000 - "GET /health HTTP/1.1" 200 OK'
    gin = '[GIN] 2025/03/18 - 23:14:48 | 200 |            0s |       127.0.0.1 | HEAD     "/"'
    show = '[GIN] 2025/03/18 - 23:14:49 | 200 |     13.5051ms |       127.0.0.1 | POST     "/api/show"'
    chat = '[GIN] 2025/03/18 - 23:10:03 | 500 |     11.2662ms |       127.0.0.1 | POST     "/api/chat"'
    assert access(uvicorn) == ("GET", "/health", "200")
    assert access(gin) == ("HEAD", "/", "200")
    assert access(chat) == ("POST", "/api/chat", "500")
    assert is_probe(uvicorn) and is_probe(gin) and is_probe(show)
    assert not is_probe(chat)
    assert not is_probe('"POST /v1/chat/completions HTTP/1.1" 200 OK')


RUNNER_DIED = """\
[GIN] 2025/03/18 - 23:10:03 | 200 |     11.2662ms |       127.0.0.1 | POST     "/api/chat"
time=2025-03-18T23:10:03.934+03:00 level=ERROR source=server.go:449 msg="llama runner terminated" error="exit status 2"
[GIN] 2025/03/18 - 23:14:48 | 200 |            0s |       127.0.0.1 | HEAD     "/"
[GIN] 2025/03/18 - 23:14:48 | 200 |       512.2µs |       127.0.0.1 | GET      "/api/tags"
[GIN] 2025/03/18 - 23:14:49 | 200 |    999.2685ms |       127.0.0.1 | POST     "/api/pull"
[GIN] 2025/03/18 - 23:14:49 | 200 |     13.5051ms |       127.0.0.1 | POST     "/api/show"
"""


def test_a_dead_runner_behind_a_front_end_answering_its_own_requests_is_failed(rules) -> None:
    d = analyze_text(RUNNER_DIED, rules=rules)
    assert d.verdict == "failed", d.summary
    assert d.decisive is not None and "llama runner terminated" in d.decisive.line


def test_a_runner_that_failed_and_then_answered_a_chat_is_healthy(rules) -> None:
    served = RUNNER_DIED + (
        'time=2025-03-18T23:15:01.001+03:00 level=INFO source=server.go:594 msg="llama runner started in 2.1 seconds"\n'
        '[GIN] 2025/03/18 - 23:15:09 | 200 |      8.012s |       127.0.0.1 | POST     "/api/chat"\n'
    )
    d = analyze_text(served, rules=rules)
    assert d.verdict == "healthy", (d.verdict, d.summary)


def test_a_gin_front_end_answering_only_server_errors_is_stalled(rules) -> None:
    log = "".join(
        f'[GIN] 2025/03/18 - 23:{m:02d}:00 | 500 |      1.2s |       127.0.0.1 | POST     "/api/generate"\n'
        f'[GIN] 2025/03/18 - 23:{m:02d}:01 | 200 |     20µs |       127.0.0.1 | GET      "/api/version"\n'
        for m in range(10, 16)
    )
    d = analyze_text(log, rules=rules)
    assert d.verdict == "stalled", (d.verdict, d.summary)
    assert "front end answers only errors" in d.summary


def test_a_supervisors_failed_respawn_is_the_consequence_of_the_crash_it_reported(rules) -> None:
    log = (
        'time=2024-03-25T12:28:47.859-05:00 level=WARN source=server.go:113 msg="server crash 48 - exit code 1 - '
        'respawning"\n'
        'time=2024-03-25T12:28:48.370-05:00 level=ERROR source=server.go:116 msg="failed to restart server exec: '
        'already started"\n'
    )
    d = analyze_text(log, rules=rules)
    assert d.verdict == "failed"
    assert d.decisive is not None and "server crash 48" in d.decisive.line
