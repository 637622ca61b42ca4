"""Round trips of a fresh probe, counted by the delay proxy: how often the client spoke again after
hearing the server (``DelayProxy.exchanges``). The number is pinned: a change that adds a round trip
to the login or the exec fails here, whatever the timing."""

from __future__ import annotations

import asyncio
import json
import subprocess

from fleetdiag.delayproxy import DelayProxy
from fleetdiag.inventory import parse_inventory
from fleetdiag.probe import ProbeSettings, probe_host
from fleetdiag.records import FAILED

from .sshd import ssh_argv

SEED = (
    __import__("pathlib").Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo" / "dp_rank.log"
).read_text()
# A fresh probe: version + KEXINIT, ECDH + NEWKEYS, the ssh-userauth service request, auth `none`,
# the publickey query (PK_OK), the signed publickey, channel open, exec (its output follows the reply),
# and the channel close. OpenSSH's `ssh host true` spends the same login.
PROBE_EXCHANGES = 9
RTT_MS = 40.0  # enough that every reply is heard before the next request: the count is the protocol's


def _inventory(sshd, port: int, log) -> object:
    return parse_inventory(
        f"hosts:\n  far:\n    address: 127.0.0.1\n    port: {port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {json.dumps(str(log))}\n",
        "rt.yaml",
    )


def test_fresh_probe_round_trips(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED)

    async def go():
        proxy = await DelayProxy("127.0.0.1", sshd.port, RTT_MS).start()
        sshd.trust(proxy.port)
        try:
            host = _inventory(sshd, proxy.port, log).hosts["far"]
            counts = []
            for _ in range(2):
                proxy.reset_counts()
                res = await probe_host(host, ProbeSettings(transport=sshd.opts()))
                assert res.verdict == FAILED, res.error
                counts.append(proxy.exchanges)
            proxy.reset_counts()
            ssh = await asyncio.create_subprocess_exec(
                *ssh_argv(sshd, proxy.port), "true", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            _, err = await ssh.communicate()
            assert ssh.returncode == 0, err
            return counts, proxy.exchanges, proxy.connections
        finally:
            await proxy.stop()

    counts, ssh_true, conns = asyncio.run(go())
    print("exchanges: probe", counts, "ssh true", ssh_true)
    assert conns == 3  # two fresh probes and one ssh: nothing reused
    assert counts == [PROBE_EXCHANGES, PROBE_EXCHANGES], counts
    # the probe's login + exec costs no more round trips than OpenSSH's `ssh host true`
    assert PROBE_EXCHANGES <= ssh_true, (PROBE_EXCHANGES, ssh_true)
