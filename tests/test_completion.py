"""Shell completion: selector arguments complete host and group names from the inventory, through
click's completion protocol (the API, and bash itself sourcing ``_FLEETDIAG_COMPLETE=bash_source``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.shell_completion import ShellComplete

from fleetdiag.cli import main

ROOT = Path(__file__).resolve().parent.parent

INVENTORY = """\
hosts:
  gpu01: {address: 10.0.0.1}
  gpu02: {address: 10.0.0.2}
  gpu10: {address: 10.0.0.10}
  login: {address: 10.0.0.99}
groups:
  training: [gpu01, gpu02]
  gpu-serving: [gpu10]
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    p = tmp_path / "inventory.yaml"
    p.write_text(INVENTORY)
    return p


def complete(args: list[str], incomplete: str) -> list[str]:
    comp = ShellComplete(main, {}, "fleetdiag", "_FLEETDIAG_COMPLETE")
    return [c.value for c in comp.get_completions(args, incomplete)]


@pytest.mark.parametrize("command", ["probe", "sweep", "watch", "hosts", "history", "preflight"])
def test_every_selector_argument_completes_hosts_and_groups(inv, command):
    assert complete(["-i", str(inv), command], "gpu") == ["gpu-serving", "gpu01", "gpu02", "gpu10"]
    assert complete(["-i", str(inv), command], "tr") == ["training"]


def test_completion_reads_the_inventory_from_the_environment(inv, monkeypatch):
    monkeypatch.setenv("FLEETDIAG_INVENTORY", str(inv))
    assert complete(["probe"], "lo") == ["login"]
    assert complete(["probe"], "") == ["all", "training", "gpu-serving", "gpu01", "gpu02", "gpu10", "login"]


def test_completion_completes_the_item_after_the_last_comma(inv):
    base = ["-i", str(inv), "probe"]
    assert complete(base, "training,gpu1") == ["training,gpu10"]
    assert complete(base, "all,!gpu0") == ["all,!gpu01", "all,!gpu02"]
    assert complete(base, "training,&gpu0") == ["training,&gpu01", "training,&gpu02"]


def test_completion_is_quiet_and_empty_when_the_inventory_is_missing_or_broken(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no ./inventory.yaml
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("FLEETDIAG_INVENTORY", raising=False)
    assert complete(["probe"], "gpu") == []
    assert complete(["-i", str(tmp_path / "nope.yaml"), "probe"], "gpu") == []
    broken = tmp_path / "broken.yaml"
    broken.write_text("hosts:\n  gpu01: {address: '10.0.0.1; rm -rf /'}\n  : [\n")
    assert complete(["-i", str(broken), "probe"], "gpu") == []
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert complete(["-i", str(binary), "sweep"], "") == []
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def _wrapper(tmp_path: Path) -> dict[str, str]:
    """A ``fleetdiag`` on PATH running this checkout (as the installed entry point would)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "fleetdiag"
    exe.write_text(
        f'#!/bin/sh\nexec {sys.executable} -c \'from fleetdiag.cli import main; main(prog_name="fleetdiag")\' "$@"\n'
    )
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}


def test_bash_complete_protocol_through_the_program(inv, tmp_path):
    env = _wrapper(tmp_path)
    env.update(_FLEETDIAG_COMPLETE="bash_complete", COMP_WORDS=f"fleetdiag -i {inv} sweep gpu0", COMP_CWORD="4")
    out = subprocess.run(["fleetdiag"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["plain,gpu01", "plain,gpu02"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_the_documented_bash_source_line_completes_in_bash(inv, tmp_path):
    """The README's line, sourced by a real bash; its completion function fills COMPREPLY."""
    env = _wrapper(tmp_path)
    script = (
        'eval "$(_FLEETDIAG_COMPLETE=bash_source fleetdiag)"\n'
        f"COMP_WORDS=(fleetdiag -i {inv} probe tra); COMP_CWORD=4\n"
        "_fleetdiag_completion fleetdiag\n"  # bash passes the command name as $1
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["training"]
    readme = (ROOT / "README.md").read_text()
    assert 'eval "$(_FLEETDIAG_COMPLETE=bash_source fleetdiag)"' in readme
