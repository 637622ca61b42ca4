"""One in-process ``probe_host`` (a library call), timed without interpreter start-up.

Run by bench/single_host.py in a fresh interpreter per measurement::

    python bench/_probe_once.py INVENTORY HOST KNOWN_HOSTS KEY [--standard-login]

Prints one JSON object: wall_ms of ``probe_host`` alone (a fresh connection;
imports and rules loaded beforehand, as a long-lived library user would have
them), import_ms, and the result's verdict, decisive line and timing.

``--standard-login`` sets FLEETDIAG_SSH_LOGIN=standard: asyncssh's own login
(auth ``none`` first, the public-key query before signing, auth after the
service accept), to show what fleetdiag.ssh.sshfast saves.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from fleetdiag.inventory import load_inventory  # noqa: E402
from fleetdiag.probe import ProbeSettings, probe_host  # noqa: E402
from fleetdiag.ssh.transport import TransportOptions  # noqa: E402


def main() -> None:
    inv_path, name, known_hosts, key = sys.argv[1:5]
    if "--standard-login" in sys.argv[5:]:
        os.environ["FLEETDIAG_SSH_LOGIN"] = "standard"
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
