"""A real OpenSSH sshd on 127.0.0.1 for the integration tests and benchmarks.

It has its own host key, client key, authorized_keys, known_hosts and an
ssh_config, all in a temp dir, so nothing of the user's ssh setup is touched.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fleetdiag.ssh.transport import TransportOptions

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return path


@dataclass
class Sshd:
    dir: Path
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    ssh_config: Path
    host_pub: str
    proc: subprocess.Popen | None = None

    def cli_args(self) -> list[str]:
        """The options that point a fleetdiag command at this server's known_hosts, key and ssh config."""
        return [
            "--known-hosts",
            str(self.known_hosts),
            "--identity",
            str(self.client_key),
            "--ssh-config",
            str(self.ssh_config),
        ]

    def opts(self, **kw) -> TransportOptions:
        base = dict(
            known_hosts=str(self.known_hosts),
            client_keys=[str(self.client_key)],
            ssh_config=[str(self.ssh_config)],
            connect_timeout=10,
            command_timeout=30,
        )
        base.update(kw)
        return TransportOptions(**base)

    def trust(self, port: int, host: str = "127.0.0.1") -> None:
        """Vouch for this server's key on another port (a delay proxy in front of it)."""
        with open(self.known_hosts, "a") as fh:
            fh.write(f"[{host}]:{port} {self.host_pub}\n")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_sshd(workdir: Path, extra_config: str = "", login_shell: str | None = None) -> Sshd:
    """``login_shell``: run every exec request as that shell would (``SHELL -c "$SSH_ORIGINAL_COMMAND"``),
    as sshd does for a user whose login shell it is (tcsh, fish, ...)."""
    if login_shell:
        extra_config += f'\nForceCommand {login_shell} -c "$SSH_ORIGINAL_COMMAND"\n'
    if not os.path.exists(SSHD):
        raise RuntimeError(f"{SSHD} missing: install openssh-server (apt-get install openssh-server)")
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = keygen(workdir / "host_ed25519")
    client_key = keygen(workdir / "client_ed25519")
    (workdir / "authorized_keys").write_text((workdir / "client_ed25519.pub").read_text())
    port = free_port()
    host_pub = (workdir / "host_ed25519.pub").read_text().split()
    known_hosts = workdir / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    user = getpass.getuser()
    config = workdir / "sshd_config"
    config.write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {workdir / "sshd.pid"}
AuthorizedKeysFile {workdir / "authorized_keys"}
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin yes
MaxStartups {os.environ.get("FLEETDIAG_SSHD_MAXSTARTUPS", "200:30:400")}
MaxSessions 200
LogLevel ERROR
{extra_config}
"""
    )
    ssh_config = workdir / "ssh_config"
    ssh_config.write_text(
        f"""Host sshd-alias
    HostName 127.0.0.1
    Port {port}
    User {user}
    IdentityFile {client_key}
    UserKnownHostsFile {known_hosts}
"""
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "sshd.log", "wb"),
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("sshd exited: " + (workdir / "sshd.log").read_text())
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    return Sshd(workdir, port, user, client_key, known_hosts, ssh_config, f"{host_pub[0]} {host_pub[1]}", proc)


def ssh_argv(server: Sshd, port: int | None = None) -> list[str]:
    """OpenSSH client arguments for the same server (benchmarks compare against it)."""
    return [
        shutil.which("ssh") or "ssh",
        "-p",
        str(port or server.port),
        "-i",
        str(server.client_key),
        "-o",
        f"UserKnownHostsFile={server.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"HostKeyAlias=[127.0.0.1]:{server.port}",
        "-F",
        "/dev/null",
        f"{server.user}@127.0.0.1",
    ]
