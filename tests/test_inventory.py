"""Inventory: loading, validation with located errors, ranges, groups, selectors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleetdiag import inventory as inv_mod
from fleetdiag.inventory import (
    Host,
    Inventory,
    InventoryError,
    InventoryNotFound,
    SelectorError,
    find_inventory,
    fold,
    load_inventory,
    parse_duration,
    parse_inventory,
    parse_size,
    select,
    split_selector,
)

REPO = Path(__file__).resolve().parents[1]


def parse(text: str, path: str = "inventory.yaml") -> Inventory:
    return parse_inventory(textwrap.dedent(text), path)


def error(text: str, path: str = "inventory.yaml") -> InventoryError:
    with pytest.raises(InventoryError) as ei:
        parse(text, path)
    return ei.value


def names(hosts: list[Host]) -> list[str]:
    return [h.name for h in hosts]


FLEET = """\
hosts:
  uk-node:
    address: 203.0.113.10
  uk-node2:
    address: 203.0.113.11
  cn-node:
    address: 198.51.100.20
  gpu[01-06]:
    jump: ops@203.0.113.1:2222
groups:
  uk: [uk-node, uk-node2]
  gpus:
    - gpu[01-06]
  serving: [uk, cn-node]
  everything: [serving, gpus]
"""


@pytest.fixture()
def fleet() -> Inventory:
    return parse(FLEET)


# --------------------------------------------------------------------------- example file


def test_repo_example_loads_and_matches_the_documented_hosts() -> None:
    inv = load_inventory(REPO / "inventory.yaml")
    assert inv.path == REPO / "inventory.yaml"
    uk = inv.hosts["uk-node"]
    assert (uk.address, uk.port, uk.user, uk.gpus, uk.region) == ("203.0.113.10", 10978, "root", 8, "uk")
    assert uk.log_path() == ("vllm", "/workspace/dflash/logs/vllm.log")
    assert uk.log_path("run") == ("run", "/workspace/dflash/logs/run.log")
    assert "cn-node" in inv.hosts
    assert [n for n in inv.hosts if n.startswith("gpu")] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert all(inv.hosts[f"gpu0{i}"].jump for i in range(1, 5))
    assert inv.groups  # it demonstrates groups


def test_repo_example_uses_documentation_addresses_only() -> None:
    import ipaddress

    doc_nets = [ipaddress.ip_network("203.0.113.0/24"), ipaddress.ip_network("198.51.100.0/24")]
    inv = load_inventory(REPO / "inventory.yaml")
    seen = [h.address for h in inv if h.address] + [h.jump.rsplit("@", 1)[-1].split(":")[0] for h in inv if h.jump]
    assert seen
    for a in seen:
        assert any(ipaddress.ip_address(a) in n for n in doc_nets), a


# --------------------------------------------------------------------------- defaults and hosts


def test_defaults_merge_scalars_logs_funnel_and_tags() -> None:
    inv = parse(
        """\
        defaults:
          user: ubuntu
          gpus: 8
          tags: [prod]
          logs:
            vllm: /var/log/vllm.log
            run: /var/log/run.log
          funnel:
            tail_lines: 80
            stall_after: 10m
        hosts:
          a:
            user: root
            tags: [h100]
            logs:
              run: /data/run.log
              train: /data/train-*.log
            funnel:
              scan_bytes: 128M
          b:
            gpus: null
            logs:
              vllm: null
        """
    )
    a, b = inv.hosts["a"], inv.hosts["b"]
    assert a.user == "root" and a.gpus == 8
    assert a.tags == ["prod", "h100"]
    # host entries merge over default logs; the defaults' first log stays the default one
    assert a.logs == {"vllm": "/var/log/vllm.log", "run": "/data/run.log", "train": "/data/train-*.log"}
    assert a.funnel == {"tail_lines": 80, "stall_after": 600.0, "scan_bytes": 128 * 1024**2}
    # explicit null clears an inherited value or log entry
    assert b.gpus is None and b.user == "ubuntu"
    assert b.logs == {"run": "/var/log/run.log"}
    # hosts do not share mutable state with the defaults or each other
    a.tags.append("x")
    assert b.tags == ["prod"]


def test_host_with_empty_settings_and_logs_shorthand() -> None:
    inv = parse(
        """\
        hosts:
          bare:
          one-log:
            logs: /workspace/logs/vllm.log
        """
    )
    assert inv.hosts["bare"] == Host(name="bare")
    assert inv.hosts["one-log"].logs == {"default": "/workspace/logs/vllm.log"}


def test_ssh_config_alias_host_targets_its_name() -> None:
    inv = parse(
        """\
        hosts:
          lab-box: {}
          direct:
            address: 203.0.113.5
        """
    )
    assert inv.hosts["lab-box"].address is None
    assert inv.hosts["lab-box"].target == "lab-box"
    assert inv.hosts["direct"].target == "203.0.113.5"


# --------------------------------------------------------------------------- ranges and folding


def test_range_expands_in_order_with_shared_settings(fleet: Inventory) -> None:
    gpus = [h for h in fleet if h.name.startswith("gpu")]
    assert names(gpus) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06"]
    assert {h.jump for h in gpus} == {"ops@203.0.113.1:2222"}
    assert list(fleet.hosts)[:3] == ["uk-node", "uk-node2", "cn-node"]  # file order kept


def test_range_with_commas_inside_brackets_as_host_key() -> None:
    inv = parse("hosts:\n  gpu[01-02,05]:\n")
    assert list(inv.hosts) == ["gpu01", "gpu02", "gpu05"]


def test_fold() -> None:
    assert fold(["gpu01", "gpu02", "gpu04"]) == "gpu[01-02,04]"
    assert fold(["gpu04", "gpu01", "gpu02", "gpu03"]) == "gpu[01-04]"
    assert fold([]) == ""
    assert fold(["uk-node"]) == "uk-node"


def test_overlapping_ranges_are_duplicate_hosts() -> None:
    e = error(
        """\
        hosts:
          gpu[01-04]:
          gpu03:
        """
    )
    assert str(e) == "inventory.yaml:3: hosts.gpu03: duplicate host 'gpu03' (already defined by 'gpu[01-04]' at line 2)"


def test_duplicate_yaml_keys_are_errors_not_last_wins() -> None:
    e = error(
        """\
        hosts:
          a:
            port: 22
            port: 2222
        """
    )
    assert (e.line, e.key) == (4, "hosts.a.port")
    assert "first defined at line 3" in e.message


def test_bad_range_in_host_key() -> None:
    e = error("hosts:\n  gpu[01-x]:\n")
    assert (e.line, e.key) == (2, "hosts.gpu[01-x]")
    assert "bad range" in e.message


# --------------------------------------------------------------------------- groups


def test_groups_nested_resolved_in_file_order(fleet: Inventory) -> None:
    assert fleet.groups["uk"] == ["uk-node", "uk-node2"]
    assert fleet.groups["serving"] == ["uk-node", "uk-node2", "cn-node"]
    assert fleet.groups["everything"] == list(fleet.hosts)
    assert "all" not in fleet.groups  # implicit, never listed
    assert fleet.hosts["uk-node"].groups == ["uk", "serving", "everything"]
    assert fleet.hosts["gpu03"].groups == ["gpus", "everything"]


def test_group_may_reference_a_group_defined_later() -> None:
    inv = parse(
        """\
        hosts:
          a:
          b:
        groups:
          outer: [inner]
          inner: [b]
        """
    )
    assert inv.groups["outer"] == ["b"]


def test_group_cycle_is_an_error() -> None:
    e = error(
        """\
        hosts:
          a:
        groups:
          x: [y]
          y: [x, a]
        """
    )
    assert e.key == "groups.x" and e.line == 4
    assert "cycle" in e.message and "x -> y -> x" in e.message


def test_group_naming_unknown_host_suggests() -> None:
    e = error(
        """\
        hosts:
          gpu01:
        groups:
          g:
            - gpu01
            - gpu1
        """
    )
    assert str(e) == "inventory.yaml:6: groups.g: unknown host or group 'gpu1'; did you mean 'gpu01'?"


@pytest.mark.parametrize(
    "groups, msg",
    [
        ("  all: [a]\n", "reserved"),
        ("  a: [a]\n", "same name as a host"),
        ("  g: 5\n", "expected a list"),
    ],
)
def test_bad_group_definitions(groups: str, msg: str) -> None:
    e = error("hosts:\n  a:\ngroups:\n" + groups)
    assert e.line == 4 and e.key is not None and e.key.startswith("groups.")
    assert msg in e.message


def test_unquoted_exclusion_in_yaml_explains_the_tag_trap() -> None:
    e = error("hosts:\n  a:\n  b:\ngroups:\n  g:\n    - all\n    - !a\n")
    assert e.line == 7
    assert "quote exclusions" in e.message


def test_group_members_use_selector_syntax() -> None:
    inv = parse(
        """\
        hosts:
          gpu[01-04]:
          cn-node:
        groups:
          most: [all, "!gpu03", "!cn-node"]
        """
    )
    assert inv.groups["most"] == ["gpu01", "gpu02", "gpu04"]


# --------------------------------------------------------------------------- selectors


@pytest.mark.parametrize(
    "selectors, expected",
    [
        (["uk-node"], ["uk-node"]),
        (["uk"], ["uk-node", "uk-node2"]),
        (["all"], None),
        (["uk-*"], ["uk-node", "uk-node2"]),
        (["*node"], ["uk-node", "cn-node"]),
        (["gpu[02-03]"], ["gpu02", "gpu03"]),
        (["gpu[01-02,05]"], ["gpu01", "gpu02", "gpu05"]),
        (["gpu[01-02,05],cn-node"], ["cn-node", "gpu01", "gpu02", "gpu05"]),
        (["cn-node,uk-node"], ["uk-node", "cn-node"]),  # file order, not selector order
        (["cn-node", "uk-node", "cn-node"], ["uk-node", "cn-node"]),  # union, deduplicated
        (["all,!cn-node"], ["uk-node", "uk-node2", "gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06"]),
        (["all,!gpus"], ["uk-node", "uk-node2", "cn-node"]),  # exclude a group
        (["gpus,!gpu[02-05]"], ["gpu01", "gpu06"]),
        (["!gpu[01-06]"], ["uk-node", "uk-node2", "cn-node"]),  # leading exclusion starts from all
        (["all", "!uk,!gpus"], ["cn-node"]),  # exclusions apply across selector arguments
        (["gpus,!gpu03,gpu03"], ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06"]),  # left to right
        (["serving,&uk-*"], ["uk-node", "uk-node2"]),  # intersection
        ([" uk-node , cn-node "], ["uk-node", "cn-node"]),
    ],
)
def test_select_forms(fleet: Inventory, selectors: list[str], expected: list[str] | None) -> None:
    got = names(select(fleet, selectors))
    assert got == (expected if expected is not None else list(fleet.hosts))


def test_select_returns_the_inventory_host_objects(fleet: Inventory) -> None:
    assert select(fleet, ["uk-node"])[0] is fleet.hosts["uk-node"]


def test_split_selector_only_on_commas_outside_brackets() -> None:
    assert split_selector("a,gpu[01-02,05],!b,,") == ["a", "gpu[01-02,05]", "!b"]
    with pytest.raises(SelectorError):
        split_selector("gpu[01-02")


@pytest.mark.parametrize(
    "selector, fragment",
    [
        ("uk-nod", "unknown host or group 'uk-nod'; did you mean 'uk-node' or 'uk-node2'?"),
        ("all,!cn-nod", "did you mean 'cn-node'?"),  # a typo in an exclusion must not widen the set
        ("gpu[05-08]", "unknown host gpu[07-08] in range 'gpu[05-08]'"),
        ("eu-*", "'eu-*' matches no host"),
        ("gpu[01-02", "unbalanced '['"),
        ("gpu[a-b]", "bad range"),
        ("203.0.113.99", "unknown host or group '203.0.113.99'"),  # looks like a host, still not in inventory
        ("", "empty selector"),
        ("all,!", "empty term"),
    ],
)
def test_select_errors(fleet: Inventory, selector: str, fragment: str) -> None:
    with pytest.raises(SelectorError) as ei:
        select(fleet, [selector])
    assert fragment in str(ei.value)
    assert isinstance(ei.value, InventoryError)


def test_unknown_selector_suggests_only_the_closest(fleet: Inventory) -> None:
    with pytest.raises(SelectorError) as ei:
        select(fleet, ["uk-nod"])
    # cn-node is similar too, but much less so than the uk-* pair: not offered
    assert ei.value.suggestions == ["uk-node", "uk-node2"]
    assert ei.value.term == "uk-nod"


def test_unknown_selector_message_on_the_example_inventory() -> None:
    inv = load_inventory(REPO / "inventory.yaml")
    with pytest.raises(SelectorError) as ei:
        select(inv, ["uk-nod"])
    assert str(ei.value) == "unknown host or group 'uk-nod'; did you mean 'uk-node'?"


def test_unknown_selector_case_mismatch(fleet: Inventory) -> None:
    with pytest.raises(SelectorError, match="did you mean 'uk-node'"):
        select(fleet, ["UK-NODE"])


# --------------------------------------------------------------------------- located errors


def test_unknown_key_names_file_line_key_and_suggestion(tmp_path: Path) -> None:
    p = tmp_path / "inventory.yaml"
    p.write_text(
        textwrap.dedent(
            """\
            # comment
            defaults:
              user: ubuntu

            hosts:
              uk-node:
                address: 203.0.113.10
              gpu01:
                address: 203.0.113.21
                user: root
                gpus: 8
                prot: 22
            """
        )
    )
    with pytest.raises(InventoryError) as ei:
        load_inventory(p)
    e = ei.value
    assert str(e) == f"{p}:12: hosts.gpu01.prot: unknown key 'prot' (did you mean 'port'?)"
    assert (e.path, e.line, e.key) == (str(p), 12, "hosts.gpu01.prot")


@pytest.mark.parametrize(
    "text, line, key, fragment",
    [
        ("hostz:\n  a:\n", 1, "hostz", "did you mean 'hosts'?"),
        ("defaults:\n  usr: x\nhosts:\n  a:\n", 2, "defaults.usr", "did you mean 'user'?"),
        ("hosts:\n  a:\n    funnel:\n      stall: 5m\n", 4, "hosts.a.funnel.stall", "did you mean 'stall_after'?"),
        ("hosts:\n  a:\n    colour: red\n", 3, "hosts.a.colour", "allowed: address, port"),
    ],
)
def test_unknown_keys_everywhere(text: str, line: int, key: str, fragment: str) -> None:
    e = error(text)
    assert (e.line, e.key) == (line, key)
    assert fragment in e.message


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ("port: abc", "expected a port number 1-65535, got 'abc'"),
        ("port: 70000", "expected a port number 1-65535"),
        ("port: true", "got true (a boolean)"),
        ("gpus: -1", "integer >= 0"),
        ("gpus: 8.5", "integer >= 0"),
        ("tags: prod", "expected a list of strings"),
        ("logs: [a, b]", "expected a mapping"),
        ("address: root@203.0.113.5", "put it in 'user:'"),
        ("address: 203.0.113.5:2222", "put it in 'port:'"),
        ("user: -oProxyCommand=x", "starts with '-'"),
        ("region: 5", "quote numbers"),
        ("funnel: {tail_lines: 0}", "lines >= 1"),
        ("funnel: {scan_bytes: 12Q}", "expected a size"),
        ("funnel: {stall_after: soon}", "expected a duration"),
        ("funnel: {timeout: 0}", "duration > 0"),
        ("funnel: {run_start: '\\d+ Starting'}", "POSIX ERE"),
        ("funnel: {run_start: '(unclosed'}", "invalid regular expression"),
    ],
)
def test_wrong_types_are_located(setting: str, fragment: str) -> None:
    e = error(f"hosts:\n  ok:\n  gpu01:\n    {setting}\n")
    assert e.line == 4
    assert e.key is not None and e.key.startswith("hosts.gpu01.")
    assert fragment in e.message
    assert str(e).startswith("inventory.yaml:4: hosts.gpu01.")


def test_tag_item_error_points_at_the_item() -> None:
    e = error("hosts:\n  a:\n    tags:\n      - ok\n      - 2024\n")
    assert (e.line, e.key) == (5, "hosts.a.tags[1]")


def test_all_errors_are_collected_in_line_order() -> None:
    e = error("hosts:\n  a:\n    port: x\n  b:\n    gpus: y\n    prot: 1\n")
    assert [(x.line, x.key) for x in e.errors] == [(3, "hosts.a.port"), (5, "hosts.b.gpus"), (6, "hosts.b.prot")]
    assert e.errors[0] is e


@pytest.mark.parametrize(
    "text, line",
    [
        ("hosts:\n  a:\n    port: 22\n   user: x\n", 4),
        ("hosts:\n  a: {port: 22\n", 3),
        ("hosts:\n\ta: 1\n", 2),
    ],
)
def test_yaml_syntax_error_has_line(text: str, line: int) -> None:
    e = error(text)
    assert e.line == line
    assert str(e).startswith(f"inventory.yaml:{line}: invalid YAML")


@pytest.mark.parametrize("text", ["", "\n# just a comment\n"])
def test_empty_file_is_a_clear_error(text: str) -> None:
    e = error(text)
    assert "empty" in e.message and "hosts:" in e.message
    assert str(e).startswith("inventory.yaml:1:")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("- a\n- b\n", "expected a mapping"),
        ("defaults: {}\n", "missing 'hosts:'"),
        ("hosts: {}\n", "no hosts defined"),
        ("all:\n  a: 1\n", "'all' is implicit"),
    ],
)
def test_bad_top_level(text: str, fragment: str) -> None:
    e = error(text)
    assert any(fragment in x.message for x in e.errors)
    assert all(x.line is not None for x in e.errors)


def test_default_jump_through_itself_is_caught() -> None:
    e = error("defaults:\n  jump: bastion\nhosts:\n  bastion:\n    address: 203.0.113.1\n  a:\n")
    assert (e.line, e.key) == (4, "hosts.bastion.jump")
    fixed = parse("defaults:\n  jump: bastion\nhosts:\n  bastion:\n    jump: null\n  a:\n")
    assert fixed.hosts["bastion"].jump is None and fixed.hosts["a"].jump == "bastion"


def test_jump_cycle_is_caught() -> None:
    e = error("hosts:\n  a:\n    jump: b\n  b:\n    jump: root@a:22\n")
    assert "jump cycle" in e.message


def test_load_missing_file_is_inventory_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path / "nope.yaml")


# --------------------------------------------------------------------------- log_path


def test_log_path_resolution() -> None:
    h = Host(name="n", logs={"vllm": "/w/vllm.log", "run": "/w/run.log"})
    assert h.log_path() == ("vllm", "/w/vllm.log")
    assert h.log_path("run") == ("run", "/w/run.log")
    assert h.log_path("/tmp/other.log") == ("/tmp/other.log", "/tmp/other.log")
    assert h.log_path("logs/*.log") == ("logs/*.log", "logs/*.log")
    with pytest.raises(InventoryError) as ei:
        h.log_path("rnu")
    assert "known logs: vllm, run" in str(ei.value) and "did you mean 'run'" in str(ei.value)
    assert ei.value.key == "hosts.n.logs"


def test_log_path_without_logs() -> None:
    h = Host(name="bare")
    with pytest.raises(InventoryError, match="no logs configured for host 'bare'"):
        h.log_path()
    assert h.log_path("/var/log/x.log") == ("/var/log/x.log", "/var/log/x.log")


# --------------------------------------------------------------------------- sizes and durations


@pytest.mark.parametrize(
    "value, expected",
    [
        (0, 0),
        (4096, 4096),
        ("100", 100),
        ("512k", 512 * 1024),
        ("64M", 64 * 1024**2),
        ("64MiB", 64 * 1024**2),
        ("1G", 1024**3),
        ("1.5G", int(1.5 * 1024**3)),
        ("2 MB", 2 * 1024**2),
        ("10b", 10),
    ],
)
def test_parse_size(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", ["", "64Q", "-1", -1, True, None, "M", [1]])
def test_parse_size_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize(
    "value, expected",
    [
        (30, 30.0),
        (1.5, 1.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1d", 86400.0),
        ("2.5m", 150.0),
    ],
)
def test_parse_duration(value: object, expected: float) -> None:
    assert parse_duration(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["", "soon", "10x", "-5", -5, False, None, "m10", float("nan")])
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


# --------------------------------------------------------------------------- Ansible


ANSIBLE = """\
all:
  vars:
    ansible_user: ubuntu
    fleetdiag_logs:
      vllm: /workspace/logs/vllm.log
    fleetdiag_gpus: 8
    some_role_var: whatever
  hosts:
    uk-node:
      ansible_host: 203.0.113.10
      ansible_port: 10978
      ansible_user: root
      logs:
        run: /workspace/dflash/logs/run.log
  children:
    training:
      vars:
        region: us
        ansible_ssh_common_args: "-o ProxyJump=ops@203.0.113.1:2222"
      hosts:
        gpu[01:04]:
        "198.51.100.7:2200":
          gpus: 4
      children:
        big:
          vars:
            gpus: 16
          hosts:
            gpu01:
"""


def test_ansible_inventory_accepted() -> None:
    inv = parse(ANSIBLE)
    assert list(inv.hosts) == ["uk-node", "gpu01", "gpu02", "gpu03", "gpu04", "198.51.100.7"]
    uk = inv.hosts["uk-node"]
    assert (uk.address, uk.port, uk.user, uk.gpus) == ("203.0.113.10", 10978, "root", 8)
    assert uk.logs == {"vllm": "/workspace/logs/vllm.log", "run": "/workspace/dflash/logs/run.log"}
    g2 = inv.hosts["gpu02"]
    assert (g2.address, g2.user, g2.region, g2.jump, g2.gpus) == (None, "ubuntu", "us", "ops@203.0.113.1:2222", 8)
    assert inv.hosts["gpu01"].gpus == 16  # child group vars beat parent group vars
    ip = inv.hosts["198.51.100.7"]
    assert (ip.port, ip.gpus) == (2200, 4)  # host:port shorthand; host vars beat group vars
    assert inv.groups == {"training": ["gpu01", "gpu02", "gpu03", "gpu04", "198.51.100.7"], "big": ["gpu01"]}
    assert inv.hosts["gpu01"].groups == ["training", "big"]
    assert names(select(inv, ["training,!big"])) == ["gpu02", "gpu03", "gpu04", "198.51.100.7"]


def test_ansible_errors_are_located() -> None:
    e = error(
        """\
        all:
          children:
            gpus:
              host:
                gpu01:
        """
    )
    assert (e.line, e.key) == (4, "all.children.gpus.host")
    assert "did you mean 'hosts'?" in e.message
    e = error(
        """\
        all:
          hosts:
            gpu01:
              ansible_port: "twenty-two"
              fleetdiag_gpu: 8
        """
    )
    assert [(x.line, x.key) for x in e.errors] == [
        (4, "all.hosts.gpu01.ansible_port"),
        (5, "all.hosts.gpu01.fleetdiag_gpu"),
    ]
    assert "did you mean 'fleetdiag_gpus'?" in e.errors[1].message


# --------------------------------------------------------------------------- finding the inventory


@pytest.fixture()
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A cwd, an env-var file and a user-config file, none existing yet."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv(inv_mod.ENV_VAR, raising=False)
    user = tmp_path / "config" / "fleetdiag" / "inventory.yaml"
    monkeypatch.setattr(inv_mod.locate, "user_inventory_path", lambda: user)
    return {
        "cwd": cwd / "inventory.yaml",
        "env": tmp_path / "env.yaml",
        "user": user,
        "explicit": tmp_path / "explicit.yaml",
    }


def _touch(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("hosts:\n  a:\n")
    return p


def test_find_inventory_order(places: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    for p in places.values():
        _touch(p)
    monkeypatch.setenv(inv_mod.ENV_VAR, str(places["env"]))
    assert find_inventory(str(places["explicit"])) == places["explicit"]
    assert find_inventory() == places["env"]
    monkeypatch.delenv(inv_mod.ENV_VAR)
    assert find_inventory().resolve() == places["cwd"].resolve()
    places["cwd"].unlink()
    assert find_inventory() == places["user"]


def test_find_inventory_none_lists_every_place(places: dict[str, Path]) -> None:
    with pytest.raises(InventoryNotFound) as ei:
        find_inventory()
    msg = str(ei.value)
    for needle in ("-i/--inventory", "$FLEETDIAG_INVENTORY", str(places["cwd"]), str(places["user"])):
        assert needle in msg
    assert len(ei.value.looked) == 4


def test_find_inventory_explicit_or_env_must_exist(places: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _touch(places["cwd"])  # must not be used as a silent fallback
    with pytest.raises(InventoryNotFound, match="given with -i/--inventory"):
        find_inventory(str(places["explicit"]))
    monkeypatch.setenv(inv_mod.ENV_VAR, str(places["env"]))
    with pytest.raises(InventoryNotFound, match=r"from \$FLEETDIAG_INVENTORY"):
        find_inventory()


def test_user_inventory_path_is_under_fleetdiag_config() -> None:
    p = inv_mod.user_inventory_path()
    assert p.name == "inventory.yaml" and p.parent.name == "fleetdiag"


def test_ansible_children_cycle_is_located() -> None:
    e = error(
        """\
        all:
          children:
            a:
              children:
                b:
            b:
              children:
                a:
              hosts:
                x:
        """
    )
    assert (e.line, e.key) == (3, "all.children.a")
    assert "group cycle: a -> b -> a" in e.message


def test_ansible_hosts_under_all_and_alpha_ranges() -> None:
    inv = parse("all:\n  hosts:\n    node[1:3:2]:\n      ansible_ssh_host: 203.0.113.9\n")
    assert list(inv.hosts) == ["node1", "node3"] and inv.groups == {}
    assert inv.hosts["node3"].address == "203.0.113.9"
    e = error("all:\n  hosts:\n    node[a:c]:\n")
    assert e.line == 3 and "only numeric host ranges" in e.message


# --------------------------------------------------------------------------- huge ranges


@pytest.mark.parametrize("pattern", ["gpu[1-100000000]", "gpu[1-1000]-[1-1000]", "n[0-99999999/1]"])
def test_huge_range_is_refused_before_it_is_expanded(tmp_path: Path, pattern: str) -> None:
    import subprocess
    import sys
    import time

    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  gpu1:\n")
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", "from fleetdiag.cli import main; main()", "-i", str(inv), "hosts", pattern],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 2
    assert f"range '{pattern}'" in r.stderr and f"limit {inv_mod.MAX_RANGE}" in r.stderr
    assert time.monotonic() - t0 < 20  # expanding 100M names takes minutes and gigabytes
    e = error(f"hosts:\n  {pattern}:\n")
    assert (e.line, f"limit {inv_mod.MAX_RANGE}" in e.message) == (2, True)


@pytest.mark.parametrize(
    "pattern", ["gpu[1-4]", "gpu[01-16/3]", "a[1-3,7,9-10]-[1-2]", "plain", "x[5-5]", "y[1-3]z[0-1]"]
)
def test_range_size_matches_nodeset(pattern: str) -> None:
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet

    assert inv_mod.range_size(pattern) == len(NodeSet(pattern, resolver=RESOLVER_NOGROUP))


# --------------------------------------------------------------------------- selection over plain names


def test_select_names_over_a_plain_list() -> None:
    from fleetdiag.inventory import select_names

    stored = ["gpu01", "gpu02", "gpu03", "cpu01", "old-box"]
    assert select_names(stored, ["gpu[01-03]", "!gpu02"]) == ["gpu01", "gpu03"]
    assert select_names(stored, ["!gpu02"]) == ["gpu01", "gpu03", "cpu01", "old-box"]
    assert select_names(stored, ["gpu*,cpu01", "&gpu0[2-3]"]) == ["gpu02", "gpu03"]
    assert select_names(stored, "all,&*01") == ["gpu01", "cpu01"]
    assert select_names(stored, ["team", "&gpu*"], groups={"team": ["cpu01", "gpu02"]}) == ["gpu02"]
    with pytest.raises(SelectorError) as e:
        select_names(stored, ["old-bx"])
    assert e.value.suggestions == ["old-box"]
    with pytest.raises(SelectorError):
        select_names(stored, ["gpu[01-99]"])  # a range names every host it stands for
    with pytest.raises(SelectorError, match="limit"):
        select_names(stored, ["gpu[1-100000000]"])


def test_select_and_select_names_agree() -> None:
    from fleetdiag.inventory import select_names

    inv = parse("hosts:\n  gpu[01-04]:\n  cpu1:\ngroups:\n  even: [gpu02, gpu04]\n")
    for sel in (["even"], ["!even"], ["gpu*", "&even"], ["all", "!gpu01", "&gpu0[1-3]"]):
        assert names(select(inv, sel)) == select_names(list(inv.hosts), sel, inv.groups)
