"""Which failed hosts ran one job: linked by a shared endpoint, names of each other, ranks, within a window."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .evidence import WINDOW_S, HostEvidence
from .lines import _PLAIN_KEY, _keys, _Text

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
    named: set[int] | None = None  # id() of the other hosts its error lines name, once groups() indexed them

    def names(self, other: _Host) -> bool:
        """Whether this host's error lines name ``other``."""
        if self.named is not None:
            return id(other) in self.named
        if not other.keys:
            return False
        if self.text is None:
            self.text = _Text(self.ev)
        return self.text.names(other.keys)


def _index_names(hosts: list[_Host]) -> None:
    """Each host's ``named``: the hosts its error lines name, by one lookup per word of its text in an index of
    every host's names, not a test per pair (a fleet of thousands asks for millions of pairs)."""
    by_key: dict[str, list[_Host]] = {}
    # a name that is not one word (an IPv6 address): by the word it starts with, which a text naming it holds as a
    # word of its own (the name is never preceded by a word character); its regex only for the texts that do
    odd: dict[str, list[tuple[str, _Host]]] = {}
    anywhere: list[tuple[str, _Host]] = []  # one that starts with no word at all: its regex, for every text
    for h in hosts:
        for k in h.keys:
            if _PLAIN_KEY.fullmatch(k):
                by_key.setdefault(k, []).append(h)
            elif head := _PLAIN_KEY.match(k):
                odd.setdefault(head.group(0), []).append((k, h))
            else:
                anywhere.append((k, h))
    for h in hosts:
        if h.text is None:
            h.text = _Text(h.ev)
        words = h.text.words
        named = {id(o) for w in words if w in by_key for o in by_key[w] if o is not h}
        maybe = [ko for w in words if w in odd for ko in odd[w]] + anywhere
        named.update(id(o) for k, o in maybe if o is not h and h.text.names({k}))
        h.named = named


class _Union:
    """Union-find over hosts; each component keeps what it knows (ranks, world, endpoints) and why it formed."""

    def __init__(self, hosts: list[_Host]) -> None:
        self.parent = list(range(len(hosts)))
        self.ranks = [set(h.ranks) for h in hosts]
        self.world = [h.world for h in hosts]
        self.eps = [set(h.eps) for h in hosts]
        self.why: list[list[str]] = [[] for _ in hosts]
        self.unions = 0  # how many joins so far: a question asked again after none has the same answer

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
        self.unions += 1
        # the smaller set goes into the larger (a job of thousands of hosts grows by one host at a time)
        for sets in (self.ranks, self.eps):
            big, small = (sets[a], sets[b]) if len(sets[a]) > len(sets[b]) else (sets[b], sets[a])
            big |= small
            sets[b] = big
        self.world[b] = self.world[b] if self.world[b] is not None else self.world[a]
        for w in [*self.why[a], why]:
            if w and w not in self.why[b]:
                self.why[b].append(w)


class _Picks:
    """The components a peer-caused error could join, pairwise without conflict (``_Union.conflict``), kept so
    that a new one is checked against all of them at once, not one by one."""

    def __init__(self, u: _Union) -> None:
        self.u = u
        self.by_root: dict[int, int] = {}  # component -> the host that made it a candidate
        self.worlds: set[int] = set()
        self.ranks: set[int] = set()  # of the candidates whose world is known (disjoint, or they would conflict)
        self.with_eps = 0
        self.holders: dict[str, set[int]] = {}  # endpoint -> the candidates that have it

    def conflicts(self, r: int) -> bool:
        """Whether component ``r`` conflicts with any candidate."""
        u = self.u
        eps, world = u.eps[r], u.world[r]
        if eps and self.with_eps:
            near: set[int] = set()
            for ep in eps:
                near |= self.holders.get(ep, set())
            if len(near) < self.with_eps:
                return True  # another endpoint
        if world is not None and self.worlds:
            return bool(self.worlds - {world}) or bool(u.ranks[r] & self.ranks)
        return False

    def add(self, r: int, j: int) -> None:
        u = self.u
        self.by_root[r] = j
        if u.world[r] is not None:
            self.worlds.add(u.world[r])
            self.ranks |= u.ranks[r]
        if u.eps[r]:
            self.with_eps += 1
            for ep in u.eps[r]:
                self.holders.setdefault(ep, set()).add(r)


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
    holders: dict[str, list[int]] = {}
    for i, h in enumerate(hosts):  # 1: endpoints, each one's holders joined in turn
        for ep in h.eps:
            holders.setdefault(ep, []).append(i)
    for ep in sorted(holders):
        comps: list[int] = []  # the components its earlier holders are in (one, unless two jobs conflict)
        for j in holders[ep]:
            for c in dict.fromkeys(u.find(c) for c in comps):
                if u.find(j) != c and not u.conflict(c, j):
                    u.union(c, j, f"same rendezvous {ep}")
            comps = list(dict.fromkeys([*(u.find(c) for c in comps), u.find(j)]))
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
    _index_names(hosts)
    at = {id(h): i for i, h in enumerate(hosts)}
    # the hosts a peer-caused error naming nobody may join, in time order: every one with a failure time, and
    # those without an endpoint (a component with an endpoint conflicts with any other that has one: another
    # endpoint, or the same one kept apart in step 1 by a world or a rank, which only grow)
    windows = {}
    for bare in (False, True):
        idx = sorted(
            (i for i, h in enumerate(hosts) if h.t is not None and not h.ev.quiet and not (bare and h.eps)),
            key=lambda i: hosts[i].t or 0.0,
        )
        windows[bare] = (idx, [hosts[i].t or 0.0 for i in idx])
    asked: set[tuple[int, bool, int, int, int]] = set()  # a question asked again with nothing joined since
    for i in range(n):  # 3: failures in one window, pointing at a peer
        a = hosts[i]
        if not a.kind or a.t is None or a.ev.quiet:
            continue
        assert a.named is not None
        if a.named:  # the hosts it names; else every host that failed in its window ("a peer")
            pool = sorted(at[k] for k in a.named)
        else:
            bare = bool(u.eps[u.find(i)])
            idx, times = windows[bare]
            lo, hi = bisect.bisect_left(times, a.t - window), bisect.bisect_right(times, a.t + window)
            key = (u.find(i), bare, lo, hi, u.unions)
            if key in asked:
                continue
            asked.add(key)
            pool = idx[lo:hi]
        cands = _Picks(u)
        ambiguous = False
        for j in pool:
            b = hosts[j]
            if j == i or b.t is None or b.ev.quiet or abs(a.t - b.t) > window:
                continue
            r = u.find(j)
            if r == u.find(i) or r in cands.by_root or u.conflict(i, j):
                continue
            if cands.conflicts(r):
                ambiguous = True  # the peer could be in either of two jobs: no claim
                break
            cands.add(r, j)
        if ambiguous:
            continue
        picks = sorted(cands.by_root.values())
        for j in picks:
            if not u.conflict(i, j):
                u.union(i, j, f"failures within {window:.0f} s, peer-caused on all but one")
    out: dict[int, list[_Host]] = {}
    for i in range(n):
        out.setdefault(u.find(i), []).append(hosts[i])
    result = []
    for root, g in out.items():
        why = list(u.why[root])
        ranks, world = u.ranks[root], u.world[root]
        if any(w.startswith("ranks of one world") for w in why):
            why = [w for w in why if not w.startswith("ranks of one world")]
        if ranks and world is not None:
            why.append(f"ranks {_span(ranks)} of {world}")
        elif ranks and len(g) > 1:
            why.append(f"ranks {_span(ranks)}")
        result.append((g, "; ".join(why)))
    return result
