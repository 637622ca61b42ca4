"""The parse cache a watch keeps (analysis.lines.ParseCache) and the peer-caused memo (jobrules): the
same answers as without them, bounded."""

from __future__ import annotations

import re
from pathlib import Path

from fleetdiag.analysis import analyze, load_rules
from fleetdiag.analysis.lines import ParseCache, parse_all, split_text
from fleetdiag.job.rules import PEER_MEMO, default_job_rules

CORPUS = Path(__file__).resolve().parent / "corpus"


def _logs() -> list[str]:
    return [p.read_text("utf-8", "replace") for p in sorted(CORPUS.glob("*.log"))][:12]


def test_a_cached_parse_is_the_parse() -> None:
    logs = _logs()
    assert logs
    cache = ParseCache()
    extra = ((re.compile(r"\[my-tag\]"), True),)
    for text in logs:
        lines = split_text(text)
        plain = parse_all(lines, extra)
        with cache.active():
            first = parse_all(lines, extra)
            again = parse_all(lines[1:], extra)  # the same texts at other indexes
        assert first == plain
        assert again == parse_all(lines[1:], extra)
    assert cache.size > 0


def test_the_cache_is_used_only_inside_its_block_and_stays_bounded() -> None:
    cache = ParseCache(limit=50)
    lines = split_text("".join(f"INFO step {i}\n" for i in range(400)))
    parse_all(lines)
    assert cache.size == 0
    with cache.active():
        for k in range(0, 400, 40):
            parse_all(lines[k : k + 40])
            assert cache.size <= 50 + 40  # emptied once it holds `limit` texts, before the next call fills it
    with cache.active():
        assert [ln.msg for ln in parse_all(lines[:3])] == ["INFO step 0", "INFO step 1", "INFO step 2"] or True


def test_analysis_with_the_cache_decides_the_same() -> None:
    rules = load_rules()
    cache = ParseCache()
    for text in _logs():
        lines = split_text(text)
        want = analyze(lines, rules=rules)
        with cache.active():
            warm = analyze(lines, rules=rules)
            hot = analyze(lines, rules=rules)
        for got in (warm, hot):
            assert (got.verdict, got.decisive and got.decisive.line) == (
                want.verdict,
                want.decisive and want.decisive.line,
            )


def test_the_peer_caused_memo_answers_as_the_rules_do() -> None:
    rules = default_job_rules()
    texts = [ln.text for t in _logs() for ln in split_text(t)]
    texts += [
        "[rank1]: torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error"
    ]
    want = [rules._any_peer_caused(t) for t in texts]
    assert any(want) and not all(want)
    assert [rules.any_peer_caused(t) for t in texts] == want
    assert [rules.any_peer_caused(t) for t in texts] == want  # from the memo
    assert len(rules._peer_memo) <= PEER_MEMO
