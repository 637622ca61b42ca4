"""Selectors: ClusterShell ``@group`` syntax over the inventory's groups, and host lists from a file
(``^hosts.txt``) or stdin (``-``) when an inventory exists (with none, fleetdiag.inventory.adhoc reads them)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.cli import main
from fleetdiag.inventory import InventoryError, SelectorError, select, select_names

from .conftest import inventory_file
from .test_inventory import FLEET, names, parse

ALL_HOSTS = ["uk-node", "uk-node2", "cn-node", "gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06"]


@pytest.fixture()
def fleet():
    return parse(FLEET)


@pytest.mark.parametrize(
    "selectors, expected",
    [
        (["@serving"], ["uk-node", "uk-node2", "cn-node"]),
        (["@uk"], ["uk-node", "uk-node2"]),
        (["@everything"], ALL_HOSTS),
        (["@all"], ALL_HOSTS),
        (["@serving,!@uk"], ["cn-node"]),
        (["@serving,&@uk"], ["uk-node", "uk-node2"]),
        (["@gpus,!gpu[02-05]"], ["gpu01", "gpu06"]),
        (["!@gpus"], ["uk-node", "uk-node2", "cn-node"]),  # a leading exclusion starts from all
        (["@gpus", "&gpu0[1-2]"], ["gpu01", "gpu02"]),
        (["@gpus&gpu0[1-2]"], ["gpu01", "gpu02"]),  # nodeset's inline intersection
        (["@uk!uk-node2"], ["uk-node"]),  # ... and inline exclusion
        (["cn-node,@uk"], ["uk-node", "uk-node2", "cn-node"]),
    ],
)
def test_at_group_forms(fleet, selectors, expected):
    assert names(select(fleet, selectors)) == expected


@pytest.mark.parametrize(
    "selector, fragment",
    [
        ("@servng", "unknown group '@servng'; did you mean '@serving'?"),
        ("@cn-node", "unknown group '@cn-node' ('cn-node' is a host: drop the '@')"),
        ("@", "'@' names no group"),
        ("all,!@gpuz", "unknown group '@gpuz'"),  # a typo in an exclusion never widens the set
    ],
)
def test_at_group_errors(fleet, selector, fragment):
    with pytest.raises(SelectorError) as ei:
        select(fleet, [selector])
    assert fragment in str(ei.value)


def test_at_group_range_names_several_groups():
    inv = parse("hosts:\n  n[1-4]:\ngroups:\n  rack1: [n1, n2]\n  rack2: [n3]\n")
    assert names(select(inv, ["@rack[1-2]"])) == ["n1", "n2", "n3"]
    with pytest.raises(SelectorError, match="unknown group '@rack3'"):
        select(inv, ["@rack[1-3]"])


def test_host_list_file_and_stdin_with_an_inventory(fleet, tmp_path):
    f = tmp_path / "hosts.txt"
    f.write_text("# the serving hosts, minus one\nuk-node cn-node  # comment\n\ngpu[01-02],@uk\n")
    assert names(select(fleet, [f"^{f}"])) == ["uk-node", "uk-node2", "cn-node", "gpu01", "gpu02"]
    assert names(select(fleet, [f"^{f}", "!@uk"])) == ["cn-node", "gpu01", "gpu02"]
    assert names(select(fleet, ["-"], stdin=io.StringIO("gpu03\ngpu04\n"))) == ["gpu03", "gpu04"]
    # '-' twice reads stdin once
    assert select_names(["a", "b"], ["-", "-"], stdin=io.StringIO("b\n")) == ["b"]


def test_host_list_errors_name_file_and_line(fleet, tmp_path):
    f = tmp_path / "hosts.txt"
    f.write_text("uk-node\ncn-nod\n")
    with pytest.raises(SelectorError) as ei:
        select(fleet, [f"^{f}"])
    assert f"{f}:2: unknown host or group 'cn-nod'; did you mean 'cn-node'?" in str(ei.value)
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(SelectorError, match="no host in"):
        select(fleet, [f"^{tmp_path / 'empty.txt'}"])
    with pytest.raises(InventoryError, match="cannot read the host list"):
        select(fleet, [f"^{tmp_path / 'absent.txt'}"])


# --------------------------------------------------------------------------- through the CLI and sshd


def cli_inventory(sshd, tmp_path: Path, log: Path) -> Path:
    hosts = dict.fromkeys(("web1", "web2", "db1"), log)
    return inventory_file(tmp_path / "inv.yaml", hosts, sshd, groups={"serving": ["web1", "web2"], "db": ["db1"]})


def test_probe_at_group_and_stdin_list_with_an_inventory(sshd, tmp_path):
    log = tmp_path / "app.log"
    log.write_text("INFO all good\n")
    inv = cli_inventory(sshd, tmp_path, log)
    common = ["-i", str(inv), "--json", "--known-hosts", str(sshd.known_hosts), "--identity", str(sshd.client_key)]
    r = CliRunner().invoke(main, ["probe", "@serving,!web2", *common])
    assert r.exit_code in (0, 1), r.output
    assert [h["host"] for h in json.loads(r.output)["hosts"]] == ["web1"]
    r = CliRunner().invoke(main, ["probe", "-", *common], input="db1\n@serving\n")
    assert r.exit_code in (0, 1), r.output
    assert sorted(h["host"] for h in json.loads(r.output)["hosts"]) == ["db1", "web1", "web2"]
    r = CliRunner().invoke(main, ["probe", "@servng", *common])
    assert r.exit_code != 0 and "did you mean '@serving'" in r.output
