"""bench/accuracy.py as a report in CI: per-set right counts can only go up, no decoy is ever chosen.

The floors are the numbers measured when they were last raised; a change
that loses a case fails here with the case's id.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "accuracy.py"

# set -> the fewest right cases accepted (the present values)
FLOORS = {
    "dev": 21,
    "multinode": 4,
    "tests/corpus": 21,
    "tests/corpus_extra": 98,
    "tests/corpus_heldout": 9,
    "tests/corpus_multinode": 61,
    # run where `analyze --kernel` and the kernel corpus's e2e test are present
    "kernel": 17,
    "tests/corpus_kernel_extra": 10,
    "tests/corpus_heldout/kernel": 2,
}
# set -> the most decoys accepted (the present values; every other set: none)
DECOY_CEILINGS: dict[str, int] = {}


def _bench():
    spec = importlib.util.spec_from_file_location("fleetdiag_bench_accuracy", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_accuracy_floors(capsys):
    bench = _bench()
    res = bench.report(sweep=True)
    bench._print(res)  # the table goes to the test log as the report
    print(capsys.readouterr().out)
    sets = res["sets"]
    for name, floor in FLOORS.items():
        if name not in sets:  # a shared corpus absent on this machine
            continue
        row = sets[name]
        assert row["right"] >= floor, f"{name}: {row['right']}/{row['total']} < {floor}; wrong: {row['wrong']}"
    for name, row in sets.items():
        most = DECOY_CEILINGS.get(name, 0)
        assert row["decoys"] <= most, f"{name}: {row['decoys']} decoys chosen (at most {most}): {row['wrong']}"
    assert res["support"], "the rule-support sweep found no rules"
