"""docs/reliability.md names the test behind each claim: every ``file.py::test_name`` it links exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"

# [test_x.py::name](../tests/test_x.py) and the short form [::name](../tests/test_x.py)
LINK = re.compile(r"\[(?:[\w.]+)?::(\w+)\]\(\.\./tests/(test_\w+\.py)\)")


def test_every_test_the_reliability_doc_links_exists():
    links = LINK.findall(DOC.read_text())
    assert len(links) >= 40, links  # the hostile host / hostile inventory table at least
    missing = [
        f"{path}::{name}"
        for name, path in links
        if not re.search(rf"^(?:async )?def {name}\(", (ROOT / "tests" / path).read_text(), re.MULTILINE)
    ]
    assert not missing, missing


def test_the_hostile_table_covers_each_threat():
    text = DOC.read_text()
    section = text.split("## Hostile host / hostile inventory", 1)[1].split("\n## ", 1)[0]
    for file in (
        "test_login_shells.py",
        "test_transport_limits.py",
        "test_output.py",
        "test_inventory_values.py",
        "test_sweep_safety.py",
        "test_store.py",
        "test_inventory.py",
        "test_facts.py",
        "test_remote_tools.py",
        "test_false_healthy.py",
        "test_cli_input.py",
    ):
        assert f"(../tests/{file})" in section, file
    assert "the worst an accepted address can do is fail to connect" in " ".join(section.replace("**", "").split())
