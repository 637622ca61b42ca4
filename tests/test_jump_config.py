"""ProxyJump chains from the ssh config (``~/.ssh/config`` or --ssh-config) through real sshd.

The same sshd serves every hop; a DelayProxy (zero delay) in front of it for each hop counts the
connections that really went through that hop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fleetdiag.delayproxy import DelayProxy
from fleetdiag.inventory import Host
from fleetdiag.probe import ProbeSettings, probe_host
from fleetdiag.records import UNREACHABLE
from fleetdiag.ssh.reach import JUMP, TransportOptions

from .test_reliability import RULES, write_log


def _config(path: Path, sshd: Any, jump: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"Host gpu-behind\n    HostName 127.0.0.1\n    Port {sshd.port}\n    User {sshd.user}\n    ProxyJump {jump}\n"
    )
    return path


def _probe_through_proxies(sshd: Any, log: Path, opts: TransportOptions, jump_of: Any) -> tuple[Any, list[int]]:
    async def go() -> tuple[Any, list[int]]:
        proxies = [await DelayProxy("127.0.0.1", sshd.port, 0.0).start() for _ in range(2)]
        try:
            for p in proxies:
                sshd.trust(p.port)
            jump_of(",".join(f"{sshd.user}@127.0.0.1:{p.port}" for p in proxies))
            host = Host(name="behind", address="gpu-behind", logs={"vllm": str(log)})
            res = await probe_host(host, ProbeSettings(transport=opts, rules=RULES))
            return res, [p.connections for p in proxies]
        finally:
            for p in proxies:
                await p.stop()

    return asyncio.run(go())


def test_proxyjump_chain_in_home_ssh_config_connects_through_both_hops(sshd, tmp_path, monkeypatch):
    """~/.ssh/config says `ProxyJump a,b`: each hop is connected through, with fleetdiag's keys and known_hosts."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    log = write_log(tmp_path / "v.log", b"INFO fine\n")
    opts = sshd.opts(ssh_config=None)  # the default: ~/.ssh/config
    res, seen = _probe_through_proxies(sshd, log, opts, lambda chain: _config(home / ".ssh" / "config", sshd, chain))
    assert res.verdict != UNREACHABLE, res.error
    assert seen == [1, 1]  # one connection through each hop


def test_proxyjump_chain_from_the_config_option_names_the_failing_hop(sshd, tmp_path):
    cfg = _config(tmp_path / "ssh_config", sshd, f"{sshd.user}@127.0.0.1:{sshd.port},127.0.0.1:1")
    log = write_log(tmp_path / "v.log", b"INFO fine\n")
    host = Host(name="behind", address="gpu-behind", logs={"vllm": str(log)})
    res = asyncio.run(probe_host(host, ProbeSettings(transport=sshd.opts(ssh_config=[str(cfg)]), rules=RULES)))
    assert res.verdict == UNREACHABLE
    assert res.error_kind == JUMP and "jump host 127.0.0.1:1" in (res.error or ""), res.error


def test_config_jump_reads_the_chain_with_the_one_parser(tmp_path):
    from fleetdiag.ssh.transport import config_jump

    cfg = tmp_path / "cfg"
    cfg.write_text("Host a\n    ProxyJump u@[::1]:2222,b:23\nHost c\n    ProxyJump none\nHost d\n    ProxyJump x,,y\n")
    opts = TransportOptions(ssh_config=[str(cfg)])
    hops = config_jump("a", None, None, opts)
    assert [(h.host, h.port, h.user) for h in hops] == [("::1", 2222, "u"), ("b", 23, None)]
    assert config_jump("c", None, None, opts) == []
    assert config_jump("elsewhere", None, None, opts) == []
    try:
        config_jump("d", None, None, opts)
    except ValueError as exc:
        assert "empty hop" in str(exc)
    else:
        raise AssertionError("a malformed chain must not pass")
