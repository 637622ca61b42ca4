"""Shared fixtures: a real OpenSSH sshd on loopback, and log writers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Commands the tests run keep no connections unless a test asks (--persist): no keeper outlives the suite.
os.environ.setdefault("FLEETDIAG_PERSIST", "0")

from .sshd import Sshd, start_sshd

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
LOGS = ROOT / "logs"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Sshd:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()
