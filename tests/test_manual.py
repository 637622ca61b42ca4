"""``fleetdiag completion bash|zsh|fish`` and ``fleetdiag manual``: both made from the click
definitions, so an option added is documented and completed without anyone remembering to."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import click
from click.testing import CliRunner

from fleetdiag.cli import main
from fleetdiag.cli.manual import commands

from .test_completion import INVENTORY, _wrapper

ROOT = Path(__file__).resolve().parent.parent


def test_docs_cli_md_is_what_the_manual_prints():
    res = CliRunner().invoke(main, ["manual"])
    assert res.exit_code == 0, res.output
    assert (ROOT / "docs" / "cli.md").read_text() == res.stdout, (
        "docs/cli.md drifted from the commands: run `fleetdiag manual > docs/cli.md`"
    )


def test_the_manual_names_every_command_and_every_option():
    text = CliRunner().invoke(main, ["manual"]).stdout
    for name, cmd in commands():
        assert f"## fleetdiag {name}\n" in text
        with click.Context(cmd) as c:
            for p in cmd.get_params(c):
                if isinstance(p, click.Option) and p.expose_value and not p.hidden:
                    assert any(f"`{o}" in text or f" {o}" in text for o in p.opts), (name, p.opts)
    assert "--only VERDICTS" in text and "--format [text|json|jsonl|csv|md|html]" in text


def test_the_man_page_renders_without_a_warning():
    page = CliRunner().invoke(main, ["manual", "--man"]).stdout
    assert page.startswith(".TH FLEETDIAG 1")
    res = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-rLL=100n"], input=page, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and res.stderr == "", res.stderr
    shown = re.sub(r".\x08", "", res.stdout).replace("\u2010", "-").replace("\u2212", "-")  # no overstrike
    assert "fleetdiag probe" in shown and "--only VERDICTS" in shown and "--per-address" in shown


def test_completion_scripts_load_in_their_shells_and_bash_completes(tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    env = _wrapper(tmp_path)
    scripts = {}
    for shell in ("bash", "zsh", "fish"):
        out = subprocess.run(["fleetdiag", "completion", shell], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and f"_FLEETDIAG_COMPLETE={shell}_complete" in out.stdout, out.stderr
        path = tmp_path / f"completion.{shell}"
        path.write_text(out.stdout)
        scripts[shell] = path
    assert subprocess.run(["zsh", "-n", str(scripts["zsh"])], capture_output=True).returncode == 0
    assert subprocess.run(["fish", "--no-execute", str(scripts["fish"])], capture_output=True).returncode == 0
    script = (
        f"source {scripts['bash']}\n"
        f"COMP_WORDS=(fleetdiag -i {inv} probe tra); COMP_CWORD=4\n"
        "_fleetdiag_completion fleetdiag\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["training"]
    bad = subprocess.run(["fleetdiag", "completion", "tcsh"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "tcsh" in bad.stderr
