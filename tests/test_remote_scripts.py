"""The remote scripts are real files shipped as package data, clean under ``shellcheck -s sh``,
and every script fleetdiag sends is built by the one builder in ``fleetdiag.remote``."""

from __future__ import annotations

import shutil
import subprocess
from importlib import resources

import pytest

from fleetdiag import facts, preflight, remote
from fleetdiag.facts import parse_launch
from fleetdiag.remote import follow, funnel

SHIPPED = sorted(p.name for p in resources.files("fleetdiag.remote").iterdir() if p.name.endswith((".sh", ".awk")))


def test_remote_scripts_are_shipped():
    assert {
        "funnel.sh",
        "end.sh",
        "facts_gpu.sh",
        "facts_serve.sh",
        "preflight.sh",
        "follow_funcs.sh",
        "follow_loop.sh",
        "follow_pre.sh",
        "follow_main.sh",
        "follow.awk",
        "lib.awk",
    } <= set(SHIPPED)


def test_comment_lines_left_out_are_never_data():
    """``remote.load`` leaves whole-line comments out of what a host receives. That is safe only
    while no such line sits inside a quoted string or a here-document: checked here for every
    shipped .sh file by asking dash whether the text before each comment line ends inside a quote."""
    left_out = 0
    for name in [n for n in SHIPPED if n.endswith(".sh")]:
        text = resources.files("fleetdiag.remote").joinpath(name).read_text(encoding="utf-8")
        assert "<<" not in text, f"{name}: a here-document could hold '#' lines"
        lines = text.splitlines(keepends=True)
        sent = remote.load(name)
        assert "".join(ln for ln in lines if not ln.lstrip(" \t").startswith("#")) == sent
        for i, ln in enumerate(lines):
            if not ln.lstrip(" \t").startswith("#") or i == 0:
                continue
            left_out += 1
            r = subprocess.run(["dash", "-n"], input="".join(lines[:i]), capture_output=True, text=True, check=False)
            assert "nterminated quoted string" not in r.stderr, f"{name}:{i + 1} is inside a quoted string"
    assert left_out > 50  # the check ran over the real comments
    script = funnel.build_script(funnel.FunnelSpec(log="/x", keywords="E", run_start="S", tags="T"), "@@m")
    assert "# shellcheck" not in script and "\n#" not in script


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck missing (scripts/test installs it)")
@pytest.mark.parametrize("name", [n for n in SHIPPED if n.endswith(".sh")])
def test_shellcheck_clean(name):
    path = resources.files("fleetdiag.remote").joinpath(name)
    with resources.as_file(path) as f:
        r = subprocess.run(["shellcheck", "-s", "sh", str(f)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout


def test_every_script_uses_the_one_builder_and_awk_lib():
    spec = funnel.FunnelSpec(log="/x", keywords="a", run_start="b", tags="c")
    scripts = [
        funnel.build_script(spec, "@@FD:t"),
        follow.build_script(follow.FollowSpec(funnel=spec), "@@FD:t"),
        preflight.build_script(parse_launch(["vllm", "serve", "m"]), "@@FD:t"),
    ]
    lib = "FD_AWKLIB=" + remote.quote(remote.awk_lib())
    for s in scripts:
        assert lib in s
    assert remote.load("facts_base.sh") + remote.load("facts_gpu.sh") == facts.GPU_SNIPPET
    # the awk programs clip with the shared helper, none with its own copy
    for name in SHIPPED:
        text = remote.load(name)
        if name != "lib.awk":
            assert "bytes cut]" not in text, name


def test_awk_lib_clips_both_ends_and_prints_big_integers():
    prog = remote.awk_lib() + 'BEGIN { ML = 10; print fd_clip("abcdefghijKLMNOPQRSTUV"); print fd_int(10737418240) }'
    for awk in ("mawk", "gawk", "busybox"):
        exe = shutil.which(awk)
        if exe is None:
            continue
        argv = [exe, "awk", prog] if awk == "busybox" else [exe, prog]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split("\n")
        assert out[0] == "abcde...[fleetdiag: 12 bytes cut]...RSTUV", awk
        assert out[1] == "10737418240", awk


def test_the_wrapper_decodes_with_base64_without_it_and_when_it_fails(tmp_path):
    """The exec line decodes its payload with ``base64 -d`` where the host has one, and with awk where
    it has none, or one that fails or prints nothing: the same script runs, once, every time."""
    script = remote.script({"FD_X": 'it\'s "quoted" $HOME `id`'}, 'printf "%s|%s\\n" "$FD_X" "$0"\n')
    command = remote.remote_command(script)
    want = 'it\'s "quoted" $HOME `id`|fleetdiag-remote\n'
    tools = {name: shutil.which(name) for name in ("sh", "awk", "base64")}
    assert all(tools.values()), tools
    for variant in ("real", "missing", "failing", "silent"):
        bindir = tmp_path / variant
        bindir.mkdir()
        for name in ("sh", "awk"):
            (bindir / name).symlink_to(tools[name])
        if variant == "real":
            (bindir / "base64").symlink_to(tools["base64"])
        elif variant != "missing":
            fake = bindir / "base64"
            fake.write_text("#!/bin/sh\nexit 1\n" if variant == "failing" else "#!/bin/sh\nexit 0\n")
            fake.chmod(0o755)
        out = subprocess.run(
            [tools["sh"], "-c", command], env={"PATH": str(bindir)}, capture_output=True, text=True, timeout=30
        )
        assert (out.stdout, out.returncode) == (want, 0), (variant, out.stderr)
