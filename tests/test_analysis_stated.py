"""A failure stated on a logger's error line above a cut traceback, a request's failure after the engine died,
and the category of join timeouts and of a warm-up answered by a gateway.

The real logs behind each class are corpus cases (tests/corpus_extra, through the CLI over sshd in
test_corpus_e2e.py); these pin the boundaries the conventions draw, on the pure analyzer.
"""

from __future__ import annotations

import pytest

from fleetdiag.analysis import analyze_text
from fleetdiag.analysis.lines import parse_line
from fleetdiag.records import Line

FRAMES = (
    '  File "/srv/lib/python3.11/site-packages/ray/serve/_private/deployment_state.py", line 695, in check_ready\n'
    "    ) = ray.get(self._ready_obj_ref)\n"
    '  File "/srv/lib/python3.11/site-packages/ray/_private/worker.py", line 2755, in get\n'
    "    values, debugger_breakpoint = worker.get_objects(object_refs, timeout=timeout)\n"
)


@pytest.mark.parametrize(
    ("text", "level", "time", "msg"),
    [
        # Python logging's "%(levelname)s %(asctime)s" (Ray Serve's controller and replicas)
        (
            "ERROR 2025-04-02 17:25:34,553 controller 2922 -- Exception in Replica(id='m3')",
            "ERROR",
            "2025-04-02 17:25:34,553",
            "controller 2922 -- Exception in Replica(id='m3')",
        ),
        (
            "INFO 2024-09-19 08:23:22,415 controller 528 proxy_state.py:758 - Removing",
            "INFO",
            "2024-09-19 08:23:22,415",
            None,
        ),
        # "%(asctime)s %(levelname)s": the level word right after a full date
        (
            "2026-08-07T18:25:43.623Z ERROR xinference.core.worker pid:41 Failed to load model q",
            "ERROR",
            "2026-08-07T18:25:43.623Z",
            "xinference.core.worker pid:41 Failed to load model q",
        ),
        ("2025-01-02 03:04:05 WARNING disk almost full", "WARNING", "2025-01-02 03:04:05", "disk almost full"),
        # a word that only starts like a level, and a level word later in the message, are the message's
        ("2025-01-02 03:04:05 ERRORS: 3 found", None, "2025-01-02 03:04:05", "ERRORS: 3 found"),
        ("2025-01-02 03:04:05 job done, ERROR count 0", None, "2025-01-02 03:04:05", "job done, ERROR count 0"),
    ],
)
def test_a_level_word_beside_a_full_date_is_the_line_level(text: str, level: str | None, time: str, msg: str | None):
    ln = parse_line(0, Line(0, text, 1))
    assert (ln.level, ln.time) == (level, time)
    if msg is not None:
        assert ln.msg == msg


@pytest.mark.parametrize(
    ("head", "tag"),
    [
        (
            "ERROR 2025-04-02 17:25:34,553 controller 2922 -- Exception in Replica(id='m3'), the replica will be stopped.",
            "",
        ),
        (
            "ERROR 2025-04-02 17:25:34,553 controller 2922 -- Exception in Replica(id='m3'), the replica will be stopped.",
            "(ServeController pid=2922) ",
        ),
        ("2026-08-07T18:25:43.623Z ERROR xinference.core.worker pid:41 role:local Failed to load model qwen3-rep0", ""),
        ("2024-02-22 23:50:33,698 xinference.core.worker 19432 ERROR    Failed to load model qwen-chat-1-0", ""),
    ],
)
def test_the_error_line_over_a_cut_traceback_states_the_failure(head: str, tag: str) -> None:
    """A traceback cut before its exception line: the logger's error line above it is decisive, in every
    header form; the same traceback with its exception line decides by that exception."""
    body = "Traceback (most recent call last):\n" + FRAMES
    cut = "".join(f"{tag}{ln}\n" for ln in [head, *body.splitlines()])
    d = analyze_text(cut).decisive
    assert d is not None and d.line == f"{tag}{head}", d.line if d else None
    whole = cut + f"{tag}NotImplementedError: max_concurrent_workers is not supported yet.\n"
    d = analyze_text(whole).decisive
    assert d is not None and d.exception_type == "NotImplementedError", d.line if d else None


def test_frames_without_their_head_under_an_error_line() -> None:
    """Frames printed right under an error line without "Traceback (most recent call last):" (Ray Serve's
    request handler) take that line as their header: cut, the error line is what is stated; an INFO line
    above them is no header."""
    head = "ERROR 2025-05-23 00:42:04,876 d_LLM rcja4aht 7008 -- Replica failed to load the adapter lora-7"
    d = analyze_text(head + "\n" + FRAMES).decisive
    assert d is not None and d.line == head, d.line if d else None
    info = "INFO 2025-05-23 00:42:04,876 d_LLM rcja4aht 7008 -- Replica loading the adapter lora-7"
    d = analyze_text(info + "\n" + FRAMES).decisive
    last = FRAMES.splitlines()[-1]
    assert d is not None and d.line == last, d.line if d else None  # a traceback without its final line


ENGINE_DEAD = (
    "(APIServer pid=1) ERROR 06-19 14:45:12 [async_llm.py:704] AsyncLLM output_handler failed.\n"
    "(APIServer pid=1) ERROR 06-19 14:45:12 [async_llm.py:704] Traceback (most recent call last):\n"
    '(APIServer pid=1) ERROR 06-19 14:45:12 [async_llm.py:704]   File "/v/vllm/v1/engine/core_client.py", '
    "line 1061, in get_output_async\n"
    "(APIServer pid=1) ERROR 06-19 14:45:12 [async_llm.py:704]     raise self._format_exception(outputs) from None\n"
    "(APIServer pid=1) ERROR 06-19 14:45:12 [async_llm.py:704] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue. See stack trace (above) for the root cause.\n"
)


@pytest.mark.parametrize(
    "after",
    [
        "(APIServer pid=1) ERROR 06-19 14:45:12 [serving.py:818] Error in chat completion stream generator.\n",
        "(APIServer pid=1) ERROR 2025-05-23 00:42:04,876 d_LLM rc 7008 -- Encountered failure while handling request 7008\n",
        "(APIServer pid=1) ERROR 2025-03-17 18:19:49,477 DS_VLLMDeployment mzh3 314e -- Request failed.\n",
    ],
)
def test_a_request_that_failed_after_the_engine_died_is_a_consequence(after: str) -> None:
    """EngineDeadError (the engine's own error cut) beats a front end's report that a request failed; the
    engine's own error beats both."""
    d = analyze_text(ENGINE_DEAD + after).decisive
    assert d is not None and d.exception_type == "vllm.v1.engine.exceptions.EngineDeadError", d.line if d else None
    own = "(EngineCore_DP0 pid=7) RuntimeError: CUDA error: an illegal memory access was encountered\n"
    d = analyze_text(own + ENGINE_DEAD + after).decisive
    assert d is not None and "illegal memory access" in d.line, d.line if d else None
    alone = analyze_text(after).decisive  # nothing else in the log: the request's failure is what is stated
    assert alone is not None and alone.line == after.rstrip("\n"), alone.line if alone else None


def _raised(last: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/srv/lib/python3.12/site-packages/torch/distributed/rendezvous.py", line 194, in _create_c10d_store\n'
        "    return TCPStore(\n"
        f"{last}\n"
    )


@pytest.mark.parametrize(
    ("last", "category"),
    [
        # a join that timed out: the ranks missing never reached the store or the rendezvous
        (
            "torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 1/3 clients joined.",
            "network",
        ),
        (
            "torch.distributed.DistStoreError: Timed out after 6 seconds waiting for workers. 1/2 workers joined.",
            "network",
        ),
        (
            "RuntimeError: Timed out initializing process group in store based barrier on rank: 2, for key: "
            "store_based_barrier_key:1 (world_size=2, worker_count=4, timeout=0:30:00)",
            "network",
        ),
        ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "network"),
        # a rendezvous closed on purpose is not a join that timed out
        ("torch.distributed.elastic.rendezvous.api.RendezvousClosedError", "other"),
        # a warm-up request to the server's own address answered by a gateway: the request never reached it
        ("AssertionError: res=<Response [502]>, res.text=''", "network"),
        ("AssertionError: res=<Response [503]>, res.text='<html>proxy</html>'", "network"),
        # the server itself answered the warm-up with an error: not the network's
        ('AssertionError: res=<Response [404]>, res.text=\'{"detail":"Not Found"}\'', "python"),
        ("AssertionError: res=<Response [500]>, res.text='Internal Server Error'", "python"),
    ],
)
def test_category_of_join_timeouts_and_gateway_warmups(last: str, category: str) -> None:
    d = analyze_text(_raised(last)).decisive
    assert d is not None and d.line == last and d.category == category, (d.line, d.category) if d else None
