"""A fleet spread over worker processes, so every core does handshakes, decryption and analysis.

One Python process spends ~20 ms of CPU per host (the key exchange, asyncssh's
per-packet work, the analysis): past a few hundred hosts one core is the limit,
and a wider fanout only queues more work on it. Beyond ``HOSTS_PER_WORKER``
hosts per worker, on a machine with cores to spare, the hosts are dealt to
worker processes (``python -m fleetdiag.ssh.spread``), each with its own event
loop, its share of the fanout and of the handshake bound, and all of
``probe_many``'s rules (deadlines, per-address gates, slowest first). Results
stream back as they come, so progress, ``--jsonl`` and the history see one
fleet, whatever the number of processes.

Why processes spawned fresh rather than forked: the parent runs an event loop
and may hold threads (rules loading, the keeper's start); a fork would copy
them half-way. A worker pays its own imports (~0.3 s of CPU, on its own core).

Hosts that share a first hop (one bastion, one NAT'd sshd) go to the same
worker, so the per-address handshake limit still holds fleet-wide. The
parent and its workers are the same user's, same code: the pipe between them
carries pickles, and nothing from a host crosses it except inside a
``HostResult``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import pickle
import struct
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import child
from ..probe import HostLike, ProbeSettings, _hop_text, parse_jump, probe_host
from ..records import HostResult
from .scheduler import (
    DEFAULT_FANOUT,
    DEFAULT_PER_ADDRESS,
    INTERNAL,
    CostMemory,
    FanoutOptions,
    HandshakeGate,
    Progress,
    handshake_bound,
    placeholder,
    probe_many,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

_BOOT = "from fleetdiag.ssh.spread import main; sys.exit(main())"  # run by child.python_argv
# One process analyses ~60 hosts a second (~15 ms of CPU each), more than a fanout of 256 at 240 ms
# brings back; a worker costs ~0.3 s of start-up and ~60 MB. At 600 hosts on 32 cores, one per 64
# hosts (9) gave the same wall time as one process, 10 ms more CPU per host and 4x the memory.
HOSTS_PER_WORKER = 256
MAX_WORKERS = 3  # 5,000 hosts on 16 cores: tree peak 418 MB at 3 (518 MB at 4), 221 s wall (253 s at 4)
_FRAME = struct.Struct(">I")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_count(hosts: int, requested: int | None = None, cpus: int | None = None) -> int:
    """How many processes probe ``hosts`` hosts: ``requested`` when given (0 or None: decide).

    Decided: one per ``HOSTS_PER_WORKER`` hosts, at most ``MAX_WORKERS`` and half the CPUs (the
    other half is for ssh's own work on this machine: the kernel's network stack, a keeper, the
    terminal); one on a machine of fewer than four CPUs, where a second process only competes for
    the same core.
    """
    if requested:
        return max(1, min(requested, hosts))
    cpus = cpus or usable_cpus()
    if cpus < 4:
        return 1
    return max(1, min(cpus // 2, MAX_WORKERS, hosts // HOSTS_PER_WORKER))


def deal(hosts: Sequence[HostLike], n: int, key: Callable[[HostLike], Any]) -> list[list[HostLike]]:
    """``hosts`` (already slowest first) dealt to ``n`` shares: a first hop's hosts stay together,
    each group goes to the share with the least so far, so every share gets slow and fast hosts."""
    groups: dict[Any, list[HostLike]] = {}
    for h in hosts:
        groups.setdefault(key(h), []).append(h)
    shares: list[list[HostLike]] = [[] for _ in range(n)]
    for group in groups.values():  # dicts keep first-seen order: the slowest groups are dealt first
        min(shares, key=len).extend(group)
    return [s for s in shares if s]


async def probe_fleet(
    hosts: Sequence[HostLike],
    settings: ProbeSettings,
    fanout: int = DEFAULT_FANOUT,
    *,
    workers: int | None = None,
    **options: Unpack[FanoutOptions],
) -> AsyncIterator[HostResult]:
    """``probe_many``'s contract (every host yields exactly once, as soon as known) and its options
    (``FanoutOptions``, its defaults), on ``worker_count`` processes; one worker means this process,
    as ``probe_many``."""
    unknown = set(options) - set(FanoutOptions.__annotations__)
    if unknown:
        raise TypeError(f"probe_fleet() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    n = worker_count(len(hosts), workers)
    if n <= 1:
        async for res in probe_many(hosts, settings, fanout, **options):
            yield res
        return
    deadline = options.get("deadline")
    per_address = options.get("per_address", DEFAULT_PER_ADDRESS)
    memory = options.get("memory")
    progress = options.get("progress")
    rules = await settings.rules_ready()
    ordered = memory.order(hosts) if memory is not None else list(hosts)
    gate = HandshakeGate(per_address, settings.jump_resolver)
    shares = deal(ordered, n, gate.key)
    jumps = _jump_table(ordered, settings)
    plain = dataclasses.replace(settings, rules=rules, rules_pending=None, jump_resolver=None, connect_gate=None)
    per_fanout = max(1, math.ceil(fanout / len(shares)))
    per_handshakes = max(1, handshake_bound() // len(shares))
    known = memory.pairs() if memory is not None else {}
    by_name = {h.name: h for h in ordered}
    out: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    running: dict[str, float] = {}
    counts: Counter[str] = Counter()
    done = 0
    procs: list[asyncio.subprocess.Process] = []

    async def pump(share: list[HostLike]) -> None:
        job = {
            "hosts": share,
            "settings": plain,
            "jumps": jumps,
            "fanout": per_fanout,
            "handshakes": per_handshakes,
            "deadline": deadline,
            "per_address": per_address,
            "known": {h.name: known[h.name] for h in share if h.name in known},
        }
        proc = await asyncio.create_subprocess_exec(  # isolated: nothing from the working directory runs
            *child.python_argv(_BOOT, "fleetdiag.ssh.spread"),
            cwd=child.CHILD_CWD,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        procs.append(proc)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
        proc.stdin.close()
        seen: set[str] = set()
        try:
            while True:
                head = await proc.stdout.readexactly(_FRAME.size)
                event, payload = pickle.loads(await proc.stdout.readexactly(_FRAME.unpack(head)[0]))
                if event == "done":
                    seen.add(payload.host)
                out.put_nowait((event, payload))
        except asyncio.IncompleteReadError:
            pass
        finally:
            await proc.wait()
            lost = [h for h in share if h.name not in seen]
            for h in lost:  # a worker that died (a bug, the OOM killer): its hosts still get a result
                out.put_nowait(
                    (
                        "done",
                        placeholder(
                            h,
                            f"internal error in fleetdiag: its worker process ended ({proc.returncode}) "
                            "before this host's result (please report)",
                            INTERNAL,
                        ),
                    )
                )

    tasks = [asyncio.ensure_future(pump(share)) for share in shares]
    try:
        while done < len(ordered):
            event, payload = await out.get()
            if event == "start":
                running[payload] = asyncio.get_running_loop().time()
                if progress is not None:
                    progress(Progress(len(ordered), "start", payload, None, done, dict(running), Counter(counts)))
                continue
            res: HostResult = payload
            if res.host not in by_name:
                continue
            running.pop(res.host, None)
            done += 1
            counts[res.verdict] += 1
            if memory is not None:
                memory.learn(res)
            if progress is not None:
                progress(Progress(len(ordered), "done", res.host, res, done, dict(running), Counter(counts)))
            yield res
    finally:
        for p in procs:
            if p.returncode is None:
                try:
                    p.terminate()
                except ProcessLookupError:
                    pass
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _jump_table(hosts: Sequence[HostLike], settings: ProbeSettings) -> dict[str, tuple[str, int | None, str | None]]:
    """Every jump hop text the hosts name, resolved here (the resolver reads the inventory)."""
    from .reach import parse_jump_chain

    resolve = settings.jump_resolver or parse_jump
    table: dict[str, tuple[str, int | None, str | None]] = {}
    for h in hosts:
        if not h.jump:
            continue
        table[h.jump] = resolve(h.jump)
        try:
            hops = parse_jump_chain(h.jump)
        except ValueError:
            continue
        for hop in hops:
            text = _hop_text(hop)
            table[text] = resolve(text)
    return table


# --------------------------------------------------------------------------- the worker


def _write(event: str, payload: Any) -> None:
    data = pickle.dumps((event, payload), protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.write(_FRAME.pack(len(data)) + data)
    sys.stdout.buffer.flush()


async def _work(job: dict[str, Any]) -> None:
    jumps = job["jumps"]
    settings: ProbeSettings = job["settings"]
    settings.jump_resolver = lambda text: jumps.get(text) or parse_jump(text)

    def tell(p: Progress) -> None:
        if p.event == "start":
            _write("start", p.host)

    async for res in probe_many(
        job["hosts"],
        settings,
        job["fanout"],
        deadline=job["deadline"],
        per_address=job["per_address"],
        memory=CostMemory(job["known"]),
        progress=tell,
        probe=probe_host,
        handshakes=job["handshakes"],
    ):
        _write("done", res)


def main() -> int:
    """A worker: one pickled job on stdin, framed pickled events on stdout."""
    job = pickle.loads(sys.stdin.buffer.read())
    try:
        asyncio.run(_work(job))
    except BrokenPipeError:  # the parent went away (Ctrl-C): nothing to tell anyone
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
