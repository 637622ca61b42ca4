"""One hint engine: the analyzer's rule hint and the probe's refined hint count GPUs the same way.

The cases below are the ones where the analyzer used to multiply TP × DP × PP
and count commas while the probe knew DP-local, SGLang's DP attention and
nnodes, and CUDA stopping at the first bad CUDA_VISIBLE_DEVICES entry.
"""

from __future__ import annotations

import pytest

from fleetdiag import facts as F
from fleetdiag.analysis import load_rules
from fleetdiag.analysis.decide import diagnose
from fleetdiag.analysis.hints import derive
from fleetdiag.analysis.lines import split_text

from .test_analysis import seed_log

FOUR = [{"index": i, "uuid": f"GPU-{i}aaa", "processes": []} for i in range(4)]
GENERIC = "A worker was given a GPU index that does not exist"


@pytest.fixture(scope="module")
def rules():
    return load_rules(user_default=False)


CASES = [
    pytest.param(  # old: TP 2 × DP 4 = 8 > 4 visible, a false claim
        {
            "gpus": FOUR,
            "cuda_visible_devices": "0,1,2,3",
            "serving": {"launcher": "vllm"},
            "parallel": {"tp": 2, "dp": 4, "pp": 1, "dp_local": 2, "nnodes": 2},
        },
        4,
        4,
        None,
        id="vllm-dp-local-fits",
    ),
    pytest.param(  # old: "TP 2 × DP 4 = 8 workers": the wrong count for this node
        {
            "gpus": FOUR,
            "cuda_visible_devices": "0,1",
            "serving": {"launcher": "vllm"},
            "parallel": {"tp": 2, "dp": 4, "pp": 1, "dp_local": 2},
        },
        4,
        2,
        "TP 2 × DP-local 2 = 4 workers on this node (DP 4 in all), but CUDA_VISIBLE_DEVICES=0,1 exposes 2 GPUs",
        id="vllm-dp-local-short",
    ),
    pytest.param(  # old: TP 4 × DP 4 = 16 > 4, though DP attention shares the TP GPUs
        {
            "gpus": FOUR,
            "cuda_visible_devices": "0,1,2,3",
            "serving": {"launcher": "sglang"},
            "parallel": {"tp": 4, "dp": 4, "pp": 1, "dp_attention": 1},
        },
        4,
        4,
        None,
        id="sglang-dp-attention",
    ),
    pytest.param(  # old: TP 8 = 8 > 4, though 2 nodes share the 8 workers; launcher known from the log only
        {
            "gpus": FOUR,
            "cuda_visible_devices": "0,1,2,3",
            "parallel_source": "log: SGLang server_args",
            "parallel": {"tp": 8, "dp": 1, "pp": 1, "nnodes": 2},
        },
        4,
        4,
        None,
        id="sglang-nnodes",
    ),
    pytest.param(  # old: 4 entries = 4 visible, no claim; CUDA stops at 9 and exposes one
        {"gpus": FOUR, "cuda_visible_devices": "0,9,1,2", "parallel": {"tp": 2, "dp": 2, "pp": 1}},
        4,
        1,
        "TP 2 × DP 2 = 4 workers, but CUDA_VISIBLE_DEVICES=0,9,1,2 exposes 1 GPU "
        "(9: no such GPU on this host: CUDA stops at the first bad entry)",
        id="cvd-bad-entry-in-the-middle",
    ),
    pytest.param(  # old: 3 entries; a repeat ends the list too
        {"gpus": FOUR, "cuda_visible_devices": "0,0,1", "parallel": {"tp": 2, "dp": 1, "pp": 1}},
        2,
        1,
        "TP 2 × DP 1 = 2 workers, but CUDA_VISIBLE_DEVICES=0,0,1 exposes 1 GPU (0: listed twice",
        id="cvd-repeated-entry",
    ),
]


@pytest.mark.parametrize("facts, workers, visible, claim", CASES)
def test_analyzer_and_probe_hints_agree(rules, facts, workers, visible, claim):
    fields = derive(facts)
    assert (fields["workers"], fields["visible_gpus"]) == (workers, visible)
    assert F.workers_of(facts)[0] == workers
    assert F.visibility(facts["cuda_visible_devices"], facts["gpus"]).count == visible
    dec = diagnose(split_text(seed_log()), rules, facts).decisive
    refined = F.refine_hint(dec, facts)
    if claim is None:  # the facts do not explain the error: both keep the rule's generic hint
        assert dec.hint.startswith(GENERIC)
        assert refined is None
    else:  # both say the same numbers in the same words
        assert dec.hint.startswith(claim)
        assert refined.startswith(claim)


def test_one_arithmetic_for_card_hint_and_preflight():
    """The card, the rule fields and a parsed launch count the same workers for one SGLang launch."""
    argv = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "m",
        "--tp",
        "4",
        "--dp",
        "4",
        "--enable-dp-attention",
    ]
    facts = F.build({"serve_pid": ["9"], "serve_cmd": ["\t".join(argv)], "serve_candidates": ["1"]})
    assert facts["parallel"] == {"tp": 4, "dp": 4, "pp": 1, "dp_attention": 1}
    arith = "TP 4 = 4 workers (DP 4 shares them: DP attention)"
    assert (
        "launch",
        f"{arith} · pid 9: -m sglang.launch_server --model-path m --tp 4 --dp 4 --enable-dp-attention",
    ) in F.summary_lines(facts)
    assert derive(facts)["arithmetic"] == arith
    launch = F.parse_launch(argv)
    assert (
        F.workers(launch.parallel(), launch.launcher)
        == F.workers(launch.parallel(), launch.launcher, launch.dp_attention)
        == (4, arith)
    )


def test_dp_attention_and_nnodes_read_from_the_log():
    par, source, _ = F.parallel_from_log(
        ["server_args=ServerArgs(model_path='m', tp_size=8, dp_size=2, pp_size=1, nnodes=2, enable_dp_attention=True)"]
    )
    assert par == {"tp": 8, "dp": 2, "pp": 1, "nnodes": 2, "dp_attention": 1}
    assert F.workers_of({"parallel": par, "parallel_source": source}) == (
        4,
        "TP 8 = 8 workers over 2 nodes = 4 per node (DP 2 shares them: DP attention)",
    )


@pytest.mark.parametrize(
    "facts",
    [
        None,
        {},
        {"gpus": 3},
        {"gpus": ["x", None]},
        {"gpus": [{"index": "a"}]},
        {"parallel": [1, 2]},
        {"parallel": {"tp": -2, "dp": True}},
        {"cuda_visible_devices": 7},
        {"serving": "x", "parallel": {"tp": "2"}},
    ],
)
def test_fields_never_raise_on_odd_facts(facts):
    out = F.fields(facts)
    assert isinstance(out, dict)
    if facts and facts.get("gpus") == 3:
        assert out["visible_gpus"] == 3 and out["visibility"] == "the host has 3 GPUs"
    if facts and facts.get("serving") == "x":
        assert out["workers"] == 2 and out["arithmetic"] == "TP 2 × DP 1 = 2 workers"
