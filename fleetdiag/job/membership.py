"""Which failed hosts ran one job: linked by a shared endpoint, names of each other, ranks, within a window."""

from __future__ import annotations

from dataclasses import dataclass, field

from .evidence import WINDOW_S, HostEvidence
from .lines import _keys, _Text

# ---------------------------------------------------------------- membership


@dataclass
class _Host:
    ev: HostEvidence
    kind: str
    t: float | None
    t_how: str
    eps: set[str]
    keys: set[str] = field(default_factory=set)
    text: _Text | None = None
    ranks: set[int] = field(default_factory=set)
    world: int | None = None

    def names(self, other: _Host) -> bool:
        """Whether this host's error lines name ``other``."""
        if not other.keys:
            return False
        if self.text is None:
            self.text = _Text(self.ev)
        return self.text.names(other.keys)


class _Union:
    """Union-find over hosts; each component keeps what it knows (ranks, world, endpoints) and why it formed."""

    def __init__(self, hosts: list[_Host]) -> None:
        self.parent = list(range(len(hosts)))
        self.ranks = [set(h.ranks) for h in hosts]
        self.world = [h.world for h in hosts]
        self.eps = [set(h.eps) for h in hosts]
        self.why: list[list[str]] = [[] for _ in hosts]

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def conflict(self, i: int, j: int) -> bool:
        """Evidence that two components are different jobs: other endpoints, another world size, a rank twice."""
        a, b = self.find(i), self.find(j)
        if a == b:
            return False
        if self.eps[a] and self.eps[b] and not (self.eps[a] & self.eps[b]):
            return True
        if self.world[a] is not None and self.world[b] is not None:
            # ranks are global only where the world size is known (an NCCL "[Rank 0]" may be a subgroup's)
            return self.world[a] != self.world[b] or bool(self.ranks[a] & self.ranks[b])
        return False

    def union(self, i: int, j: int, why: str) -> None:
        a, b = self.find(i), self.find(j)
        if a == b:
            return
        self.parent[a] = b
        self.ranks[b] |= self.ranks[a]
        self.world[b] = self.world[b] if self.world[b] is not None else self.world[a]
        self.eps[b] |= self.eps[a]
        self.why[b] = [w for w in self.why[b] + self.why[a] + [why] if w]


def _span(ranks: set[int]) -> str:
    """'0–7', or '0, 2, 5' when the ranks are not one run."""
    rs = sorted(ranks)
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"{rs[0]}–{rs[-1]}"
    return ", ".join(map(str, rs))


def groups(hosts: list[_Host], window: float = WINDOW_S) -> list[tuple[list[_Host], str]]:
    """Hosts that form one job, each group with how it was formed.

    1. The same non-loopback rendezvous endpoint or id.
    2. Ranks that fit one world: hosts reporting the same world size, their failures within ``window`` s (a
       host with no failure time, a stalled one, joins any), no rank twice.
    3. Failures within ``window`` s linked by a peer-caused error naming the other host, or naming no host
       of the selection ("a peer"): when the candidates could only be one job.
    Never joined: other endpoints, another world size, the same rank on two hosts (two jobs).
    """
    n = len(hosts)
    for h in hosts:
        if not h.keys:
            h.keys = _keys(h.ev)
    u = _Union(hosts)
    for i in range(n):  # 1: endpoints
        for j in range(i + 1, n):
            shared = hosts[i].eps & hosts[j].eps
            if shared and not u.conflict(i, j):
                u.union(i, j, f"same rendezvous {sorted(shared)[0]}")
    by_world: dict[int, list[int]] = {}
    for i, h in enumerate(hosts):  # 2: ranks of one world
        if h.world is not None and h.ranks:
            by_world.setdefault(h.world, []).append(i)
    for w, idx in by_world.items():
        timed = sorted((i for i in idx if hosts[i].t is not None), key=lambda i: hosts[i].t or 0.0)
        untimed = [i for i in idx if hosts[i].t is None]
        clusters: list[list[int]] = []
        for i in timed:
            if clusters and (hosts[i].t or 0.0) - (hosts[clusters[-1][-1]].t or 0.0) <= window:
                clusters[-1].append(i)
            else:
                clusters.append([i])
        if untimed:
            if len(clusters) <= 1:
                clusters = [(clusters[0] if clusters else []) + untimed]
        for c in clusters:
            seen: list[int] = [r for i in c for r in hosts[i].ranks]
            if len(c) < 2 or len(seen) != len(set(seen)) or max(seen) >= w:
                continue  # a rank twice: two jobs of one size in one window, told apart only by other evidence
            if all(not hosts[i].kind and not hosts[i].ev.quiet for i in c):
                continue  # local-origin failures only, nothing pointing at a peer: a coincidence is not a job
            for i in c[1:]:
                if not u.conflict(c[0], i):
                    u.union(c[0], i, f"ranks of one world of {w}")
    names_any = [any(o is not h and h.names(o) for o in hosts) if h.kind else False for h in hosts]
    for i in range(n):  # 3: failures in one window, pointing at a peer
        a = hosts[i]
        if not a.kind or a.t is None or a.ev.quiet:
            continue
        cands: dict[int, int] = {}
        for j in range(n):
            b = hosts[j]
            if j == i or b.t is None or b.ev.quiet or abs(a.t - b.t) > window or u.find(i) == u.find(j):
                continue
            if (a.names(b) or not names_any[i]) and not u.conflict(i, j):
                cands.setdefault(u.find(j), j)
        picks = list(cands.values())
        if any(u.conflict(x, y) for k, x in enumerate(picks) for y in picks[k + 1 :]):
            continue  # the peer could be in either of two jobs: no claim
        for j in picks:
            if not u.conflict(i, j):
                u.union(i, j, f"failures within {window:.0f} s, peer-caused on all but one")
    out: dict[int, list[_Host]] = {}
    for i in range(n):
        out.setdefault(u.find(i), []).append(hosts[i])
    result = []
    for root, g in out.items():
        why = list(dict.fromkeys(u.why[root]))
        ranks, world = u.ranks[root], u.world[root]
        if any(w.startswith("ranks of one world") for w in why):
            why = [w for w in why if not w.startswith("ranks of one world")]
        if ranks and world is not None:
            why.append(f"ranks {_span(ranks)} of {world}")
        elif ranks and len(g) > 1:
            why.append(f"ranks {_span(ranks)}")
        result.append((g, "; ".join(why)))
    return result
