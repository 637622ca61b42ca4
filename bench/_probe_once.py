"""One in-process ``probe_host`` (a library call), timed without interpreter start-up.

Run by bench/single_host.py in a fresh interpreter per measurement::

    python bench/_probe_once.py INVENTORY HOST KNOWN_HOSTS KEY [--fast-auth]

Prints one JSON object: wall_ms of ``probe_host`` alone (a fresh connection;
imports and rules loaded beforehand, as a long-lived library user would have
them), import_ms, and the result's verdict, decisive line and timing.

``--fast-auth`` is a what-if experiment, not fleetdiag's behaviour: it patches
asyncssh's client (private API) to skip the two auth round trips no option
can remove, the ``none`` method probe and the public-key query (PK_OK), and
sends the signed publickey request at once (RFC 4252 §7 allows it; OpenSSH's
sshd accepts it). It shows what those two round trips cost.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import asyncio  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

from fleetdiag.inventory import load_inventory  # noqa: E402
from fleetdiag.probe import ProbeSettings, probe_host  # noqa: E402
from fleetdiag.transport import TransportOptions  # noqa: E402


def fast_auth() -> None:
    from asyncssh import auth, connection

    init = connection.SSHClientConnection.__init__

    def patched_init(self, *a, **kw):  # start with publickey, not the "none" probe
        init(self, *a, **kw)
        self._auth_methods = [b"publickey"]

    async def start(self) -> None:  # sign at once, no PK_OK query first
        self._keypair = await self._conn.public_key_auth_requested()
        if self._keypair is None:
            self._conn.try_next_auth(next_method=True)
            return
        await self._send_signed_request()

    connection.SSHClientConnection.__init__ = patched_init
    auth._ClientPublicKeyAuth._start = start


def main() -> None:
    inv_path, name, known_hosts, key = sys.argv[1:5]
    if "--fast-auth" in sys.argv[5:]:
        fast_auth()
    host = load_inventory(inv_path).hosts[name]
    settings = ProbeSettings(transport=TransportOptions(known_hosts=known_hosts, client_keys=[key]))
    settings.get_rules()
    t_ready = time.perf_counter()
    res = asyncio.run(probe_host(host, settings))
    t1 = time.perf_counter()
    d = res.decisive
    print(
        json.dumps(
            {
                "wall_ms": (t1 - t_ready) * 1000,
                "import_ms": (t_ready - T0) * 1000,
                "verdict": res.verdict,
                "decisive": d.line if d else None,
                "timing": res.timing.__dict__ if hasattr(res.timing, "__dict__") else {},
            }
        )
    )


if __name__ == "__main__":
    main()
