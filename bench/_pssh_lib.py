"""Drive PyPI parallel-ssh (libssh2 via ssh2-python) for bench/fleet.py.

Run with the tools venv's python::

    python _pssh_lib.py KEY USER POOL COMMAND_FILE PORT [PORT ...]

Every host is 127.0.0.1 on its own delay-proxy port. Prints each host's
stdout. Note: parallel-ssh does not check host keys by default.
"""

from __future__ import annotations

import sys


def main() -> None:
    from pssh.clients import ParallelSSHClient
    from pssh.config import HostConfig

    key, user, pool, cmd_file, *ports = sys.argv[1:]
    command = open(cmd_file, encoding="utf-8").read()
    hosts = ["127.0.0.1"] * len(ports)
    config = [HostConfig(port=int(p), user=user, private_key=key) for p in ports]
    client = ParallelSSHClient(hosts, host_config=config, pool_size=int(pool), num_retries=1, timeout=120)
    output = client.run_command(command, stop_on_errors=False)
    client.join(output)
    failed = 0
    for out in output:
        if out.exception is not None:
            failed += 1
            print(f"# {out.host}: {out.exception!r}", file=sys.stderr)
            continue
        for line in out.stdout:
            sys.stdout.write(line + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
