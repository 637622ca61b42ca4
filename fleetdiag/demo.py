"""The embedded default: a local SSH server playing a small failing fleet.

One in-process asyncssh server on 127.0.0.1 runs every exec request through
the local ``/bin/sh``, exactly as sshd would, and a delay proxy per node gives
each one a realistic round trip. Logs, keys, known_hosts and the inventory
live in a temp dir; nothing leaves loopback and nothing needs root.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import asyncssh

from .delayproxy import DelayProxy
from .ssh.transport import TransportOptions


@dataclass
class DemoNode:
    name: str
    log: str  # file in fleetdiag/data/demo
    rtt_ms: float
    region: str
    story: str
    idle_seconds: float = 0.0  # how long ago the log was last written
    busy_gpu: bool = False  # its simulated nvidia-smi shows another process holding GPU 1
    expect: str = "failed"  # the verdict its story should get: the demo checks itself
    kernel: str = "h200-boot.txt"  # its kernel log (fleetdiag/data/demo/kernel), served by a stand-in dmesg
    gpu_lost: bool = False  # its simulated nvidia-smi cannot reach GPU 1 (it fell off the bus)
    port: int = 0
    path: Path | None = None


def default_nodes() -> list[DemoNode]:
    return [
        DemoNode(
            "uk-node",
            "dp_rank.log",
            240,
            "uk",
            "vLLM launched with TP=2 × DP=2 on a 2-GPU node: a worker dies at startup",
        ),
        DemoNode("cn-node", "broken_pipe.log", 500, "cn", "one worker crashes, its sibling fails with BrokenPipeError"),
        DemoNode("us-node", "healthy.log", 20, "us", "serving requests", busy_gpu=True, expect="healthy"),
        DemoNode(
            "de-node",
            "stalled.log",
            80,
            "de",
            "the launch script waits for a server that never came up",
            idle_seconds=1500,
            expect="stalled",
        ),
        DemoNode(
            "jp-node",
            "gpu_fault.log",
            150,
            "jp",
            "serving, until a worker dies of a CUDA error: its GPU fell off the bus (kernel: Xid 79)",
            idle_seconds=40,
            kernel="gpu_fault.txt",
            gpu_lost=True,
        ),
        # One torchrun job over two nodes (real logs, corpus/multinode/m1_exc): node B's rank raises,
        # node A's rank only sees the NCCL peer vanish. Both fail; the job line names B.
        DemoNode(
            "fr-node-a",
            "job_node_a.log",
            60,
            "fr",
            "rank 0 of a 2-node training job: NCCL says a remote process exited",
        ),
        DemoNode(
            "fr-node-b",
            "job_node_b.log",
            60,
            "fr",
            "rank 1 of the same job: a shape error in its own code (the job's root cause)",
        ),
        # A three-node gloo job (real logs, tests/fixtures/gloo/g3_exc_mid): the middle node's rank raises; the
        # other two ranks show only gloo's "Connection closed by peer" and their launcher's "failed (exitcode: 1)".
        DemoNode("se-node-0", "gloo_node0.log", 90, "se", "rank 0 of a 3-node gloo job: Connection closed by peer"),
        DemoNode(
            "se-node-1", "gloo_node1.log", 90, "se", "rank 1 of the same job: a shape error (the job's root cause)"
        ),
        DemoNode("se-node-2", "gloo_node2.log", 90, "se", "rank 2 of the same job: Connection closed by peer"),
    ]


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True


def _node_env(process: asyncssh.SSHServerProcess, nodes_dir: Path) -> dict[str, str]:
    """Each simulated node logs in as its own user and sees its own tools (nvidia-smi)."""
    env = dict(os.environ)
    user = process.get_extra_info("username") or ""
    bindir = nodes_dir / user / "bin"
    if user and bindir.is_dir():
        env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


async def _run_command(process: asyncssh.SSHServerProcess, nodes_dir: Path) -> None:
    """Run the exec request with the local sh, streaming its output back."""
    command = process.command or "true"
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        env=_node_env(process, nodes_dir),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None

    async def pump(src: asyncio.StreamReader, dst) -> None:
        while True:
            data = await src.read(65536)
            if not data:
                break
            dst.write(data)

    try:
        await asyncio.gather(pump(proc.stdout, process.stdout), pump(proc.stderr, process.stderr))
        code = await proc.wait()
    except (asyncssh.Error, OSError, asyncio.CancelledError):
        if proc.returncode is None:
            proc.kill()
        code = 255
    process.exit(code if code >= 0 else 128 - code)


@dataclass
class DemoFleet:
    """Start with ``async with DemoFleet(dir) as fleet``; the inventory is at ``fleet.inventory``."""

    workdir: Path
    nodes: list[DemoNode] = field(default_factory=default_nodes)
    inventory: Path = field(init=False)
    known_hosts: Path = field(init=False)
    client_key: Path = field(init=False)
    _server: asyncio.base_events.Server | None = field(default=None, init=False)
    _proxies: list[DelayProxy] = field(default_factory=list, init=False)

    @property
    def options(self) -> TransportOptions:
        return TransportOptions(
            known_hosts=str(self.known_hosts),
            client_keys=[str(self.client_key)],
            ssh_config=[],
            connect_timeout=10,
            command_timeout=30,
        )

    async def __aenter__(self) -> DemoFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = self.workdir / "client_ed25519"
        client_key.write_private_key(str(self.client_key))
        os.chmod(self.client_key, 0o600)
        authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
        self._server = await asyncssh.create_server(
            _Server,
            "127.0.0.1",
            0,
            server_host_keys=[host_key],
            authorized_client_keys=authorized,
            process_factory=lambda p: _run_command(p, self.workdir / "nodes"),
            encoding=None,
        )
        port = self._server.sockets[0].getsockname()[1]
        pub = host_key.export_public_key().decode().strip()
        lines = []
        for node in self.nodes:
            proxy = await DelayProxy("127.0.0.1", port, node.rtt_ms).start()
            self._proxies.append(proxy)
            node.port = proxy.port
            lines.append(f"[127.0.0.1]:{proxy.port} {pub}\n")
            node.path = self._write_log(node)
            self._write_gpus(node)
            self._write_kernel(node, self.workdir / "nodes" / node.name / "bin")
        self.known_hosts = self.workdir / "known_hosts"
        self.known_hosts.write_text("".join(lines))
        self.inventory = self.workdir / "inventory.yaml"
        self.inventory.write_text(self._inventory_yaml())

    def _write_log(self, node: DemoNode) -> Path:
        d = self.workdir / "nodes" / node.name / "logs"
        d.mkdir(parents=True, exist_ok=True)
        path = d / "vllm.log"
        text = resources.files("fleetdiag").joinpath("data", "demo", node.log).read_text(encoding="utf-8")
        end = time.time() - node.idle_seconds
        # @T-30@: a vLLM time stamp 30 s before the log's last write (logs whose story needs today's clock)
        text = re.sub(r"@T([+-]\d+)@", lambda m: time.strftime("%m-%d %H:%M:%S", time.localtime(end + int(m[1]))), text)
        path.write_text(text, encoding="utf-8")
        if node.idle_seconds:
            os.utime(path, (end, end))
        return path

    def _write_kernel(self, node: DemoNode, bindir: Path) -> None:
        """Stand-in dmesg and journalctl: the node's kernel log in plain dmesg form (seconds since boot).
        ``@B-3.4@`` in the data is 3.4 s before the log's last write, on this machine's boot clock.
        journalctl shows no kernel lines (as for a user outside systemd-journal), so dmesg is read."""
        try:
            with open("/proc/uptime", encoding="ascii") as fh:
                boot = time.time() - float(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            boot = time.time()
        end = time.time() - node.idle_seconds
        text = resources.files("fleetdiag").joinpath("data", "demo", "kernel", "h200-boot.txt").read_text("utf-8")
        if node.kernel != "h200-boot.txt":
            text += resources.files("fleetdiag").joinpath("data", "demo", "kernel", node.kernel).read_text("utf-8")
        text = re.sub(r"@B([+-]\d+(?:\.\d+)?)@", lambda m: f"[{max(0.0, end - boot + float(m[1])):12.6f}]", text)
        (bindir / "dmesg.txt").write_text(text, encoding="utf-8")
        for name, body in (("dmesg", 'cat "$d/dmesg.txt"\n'), ("journalctl", "exit 0\n")):
            exe = bindir / name
            exe.write_text(f"#!/bin/sh\nd={shlex.quote(str(bindir))}\n{body}")
            exe.chmod(0o755)

    def _write_gpus(self, node: DemoNode) -> None:
        """A stand-in nvidia-smi printing real output of a 2× H200 host."""
        bindir = self.workdir / "nodes" / node.name / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        smi = resources.files("fleetdiag").joinpath("data", "demo", "nvidia-smi")
        for name in (
            "nvidia-smi-query.csv",
            "nvidia-smi-query-busy.csv",
            "nvidia-smi-apps.csv",
            "nvidia-smi-L.txt",
            "nvidia-smi.txt",
            "nvidia-smi-health.csv",
            "nvidia-smi-health-lost.csv",
            "nvidia-smi-help-query-gpu.txt",
        ):
            (bindir / name).write_bytes(smi.joinpath(name).read_bytes())
        query, apps = (
            ("nvidia-smi-query-busy.csv", 'cat "$d/nvidia-smi-apps.csv"')
            if node.busy_gpu
            else ("nvidia-smi-query.csv", ":")
        )
        query_cmd, health = f'cat "$d/{query}"', "nvidia-smi-health.csv"
        if node.gpu_lost:  # a GPU has left the bus: every query names it, and the GPU list query fails
            health = "nvidia-smi-health-lost.csv"
            query_cmd = f'head -n 1 "$d/{health}"; exit 15'
        exe = bindir / "nvidia-smi"
        exe.write_text(
            "#!/bin/sh\n"
            f"d={shlex.quote(str(bindir))}\n"
            'case "$*" in\n'
            '  *--help-query-gpu*) cat "$d/nvidia-smi-help-query-gpu.txt" ;;\n'
            f'  *--query-gpu=*pci.bus_id*) cat "$d/{health}" ;;\n'
            f"  *--query-gpu=*) {query_cmd} ;;\n"
            f"  *--query-compute-apps=*) {apps} ;;\n"
            '  -L*) cat "$d/nvidia-smi-L.txt" ;;\n'
            '  *) cat "$d/nvidia-smi.txt" ;;\n'
            "esac\n"
        )
        exe.chmod(0o755)

    def _inventory_yaml(self) -> str:
        out = ["# Generated by `fleetdiag demo`: simulated nodes on a local SSH server.", "hosts:"]
        for n in self.nodes:
            out += [
                f"  {n.name}:",
                "    address: 127.0.0.1",
                f"    port: {n.port}",
                f"    user: {n.name}",
                f"    region: {n.region}",
                "    gpus: 2",
                "    logs:",
                f"      vllm: {n.path}",
            ]
        out += ["groups:", "  serving: [" + ", ".join(n.name for n in self.nodes) + "]"]
        return "\n".join(out) + "\n"

    async def stop(self) -> None:
        for p in self._proxies:
            await p.stop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
