"""Optional comparison tools: found, or installed on demand, or skipped with a reason.

Python tools (ansible-core, parallel-ssh) go into their own venv, never into
fleetdiag's: ``$FLEETDIAG_BENCH_TOOLS`` or ``~/.cache/fleetdiag-bench/venv``.
Debian's ``pssh`` (the ``parallel-ssh`` command) comes from apt-get when we
are root or have password-less sudo. A tool that cannot be had is skipped;
the bench never fails for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

INSTALL_TIMEOUT = 600


def tools_venv() -> Path:
    return Path(os.environ.get("FLEETDIAG_BENCH_TOOLS") or Path.home() / ".cache" / "fleetdiag-bench" / "venv")


def _venv_python(install: bool) -> tuple[Path | None, str]:
    venv = tools_venv()
    py = venv / "bin" / "python"
    if py.exists():
        return py, ""
    if not install:
        return None, f"no tools venv at {venv} (run without --no-install)"
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=INSTALL_TIMEOUT
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"cannot make a venv at {venv}: {exc}"
    return py, ""


def pip_tool(package: str, probe: str, install: bool) -> tuple[Path | None, str]:
    """The tools venv's python once ``import probe`` works there, installing ``package`` if needed."""
    py, why = _venv_python(install)
    if py is None:
        return None, why
    check = [str(py), "-c", f"import {probe}"]
    if subprocess.run(check, capture_output=True).returncode == 0:
        return py, ""
    if not install:
        return None, f"{package} not installed in {tools_venv()} (run without --no-install)"
    print(f"  installing {package} into {tools_venv()} ...", flush=True)
    try:
        p = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", package], capture_output=True, text=True, timeout=INSTALL_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return None, f"pip install {package} timed out"
    if p.returncode != 0 or subprocess.run(check, capture_output=True).returncode != 0:
        return None, f"pip install {package} failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
    return py, ""


def venv_bin(py: Path, name: str) -> str:
    return str(py.parent / name)


def debian_pssh(install: bool) -> tuple[str | None, str]:
    """Debian's ``parallel-ssh`` (package pssh), apt-get installed if missing and allowed."""
    found = shutil.which("parallel-ssh") or shutil.which("pssh")
    if found:
        return found, ""
    if not install:
        return None, "parallel-ssh not installed (apt-get install pssh)"
    if not shutil.which("apt-get"):
        return None, "no apt-get on this machine (install pssh by hand)"
    sudo: list[str] = []
    if os.geteuid() != 0:
        if not shutil.which("sudo") or subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode:
            return None, "needs root for apt-get install pssh"
        sudo = ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print("  installing Debian pssh (apt-get) ...", flush=True)
    try:
        cmd = sudo + ["apt-get", "install", "-y", "-qq", "pssh"]
        if subprocess.run(cmd, capture_output=True, env=env, timeout=INSTALL_TIMEOUT).returncode:
            subprocess.run(sudo + ["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=INSTALL_TIMEOUT)
            subprocess.run(cmd, capture_output=True, env=env, timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, "apt-get install pssh timed out"
    found = shutil.which("parallel-ssh") or shutil.which("pssh")
    return (found, "") if found else (None, "apt-get install pssh failed")


def clush_bin() -> tuple[str | None, str]:
    cand = Path(sys.executable).parent / "clush"
    if cand.exists():
        return str(cand), ""
    found = shutil.which("clush")
    return (found, "") if found else (None, "clush not found (pip install clustershell)")
