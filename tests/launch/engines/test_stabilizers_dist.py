"""The attention stabilizers on every engine (gloo, CPU): a gated + sinks + soft-capped model on 2
ranks follows the single-process loss curve within 1e-5 (fp32) on FSDP2 and ZeRO 2/3, under
MuonClip too (QK-Clip reads S_max before the cap; W_g goes to Muon, the sinks to AdamW), and a
SIGKILLed FSDP2 run resumes bit-exactly. FSDP2's meta-device init equals one process's
init: tests/launch/engines/test_scale.py covers the name-keyed draws for every parameter,
g_proj and sinks included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.dist_helpers import (
    assert_same_curve,
    check_ok,
    free_port,
    latest_step,
    launch,
    losses,
    normlab,
    prepare_tiny,
    start_and_kill,
    write_recipe,
)

pytestmark = pytest.mark.distributed
HALF = "data.batch_size=2"  # per rank: 2 ranks x 2 = the single run's batch of 4
STABILIZED = [
    "model.attn_gate=elementwise",
    "model.attn_sinks=true",
    "model.attn_softcap=0.1",  # below the raw logits of this tiny model: the cap binds
    "model.final_softcap=30.0",
    "model.n_kv_heads=2",
    "instruments.attention_stabilizers=true",
    "instruments.qk_spectrum=true",  # whole q/k weights through engine.storage.full
]
MUONCLIP = ["optim.name=muon", "optim.muon_scale=match_rms_adamw", "optim.muon_ns_dtype=fp32",
            "optim.qk_clip={tau: 8.0, alpha: 0.5}"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stab")
    data = prepare_tiny(root)
    out = {"root": root, "r8": write_recipe(root, data, 8, 4), "r16": write_recipe(root, data, 16)}
    for name, recipe, extra in (("ref8", "r8", []), ("ref16", "r16", []),
                                ("clip8", "r8", MUONCLIP)):
        out[name] = root / name
        check_ok(normlab("train", str(out[recipe]), *STABILIZED, *extra,
                         "--run-dir", str(out[name])))
    return out


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param(("engine.name=fsdp",), id="fsdp"),
        # ZeRO-2 (whole parameters, partitioned states): `-m slow`; CI runs ZeRO-3
        pytest.param(
            ("engine.name=deepspeed", "engine.zero_stage=2"), id="zero2", marks=pytest.mark.slow
        ),
        pytest.param(("engine.name=deepspeed", "engine.zero_stage=3"), id="zero3"),
    ],
)
def test_two_ranks_follow_one_process(tiny: dict[str, Path], engine: tuple[str, ...]) -> None:
    run = tiny["root"] / f"two_{engine[-1]}"
    check_ok(launch(tiny["r8"], run, 2, *engine, *STABILIZED, HALF))
    assert_same_curve(run, losses(tiny["ref8"]))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("sink_mass/00" in r and "gate_mean/01" in r for r in rows)
    # the statistics of whole weights (gathered from shards and ZeRO-3 partitions) are one
    # process's: the sinks' logits and the QK spectral entropy at every logged step
    ref: dict[int, dict] = {}  # a step's rows (train, eval) merged
    for r in map(json.loads, (tiny["ref8"] / "metrics.jsonl").open()):
        ref.setdefault(r["step"], {}).update(r)
    whole = [(r["step"], k, v) for r in rows for k, v in r.items()
             if k.startswith(("sink_logit/", "qk_entropy/"))]  # fmt: skip
    assert {k.split("/")[0] for _, k, _ in whole} == {"sink_logit", "qk_entropy"}
    for step, key, value in whole:
        assert value == pytest.approx(ref[step][key], rel=1e-4, abs=1e-6), (step, key)


def test_muonclip_on_fsdp_follows_one_process(tiny: dict[str, Path]) -> None:
    run = tiny["root"] / "clip_fsdp"
    check_ok(launch(tiny["r8"], run, 2, "engine.name=fsdp", *STABILIZED, *MUONCLIP, HALF))
    assert_same_curve(run, losses(tiny["clip8"]))
    rows = [json.loads(x) for x in (tiny["clip8"] / "metrics.jsonl").read_text().splitlines()]
    s_max = [r["s_max"] for r in rows if "s_max" in r]
    assert s_max and max(s_max) > 0.1  # taken before the cap: the raw logit passes the cap


def test_killed_fsdp_run_resumes_exactly(tiny: dict[str, Path]) -> None:
    run = tiny["root"] / "kill"
    cmd = [sys.executable, "-m", "normlab.launch.cli", "launch", str(tiny["r16"]),
           "engine.name=fsdp", *STABILIZED, HALF, "--nproc-per-node", "2", "--run-dir", str(run)]
    killed_at = start_and_kill([*cmd, "--master-port", str(free_port())], run, at_step=8)
    assert 8 <= killed_at < 16 and latest_step(run) == killed_at
    check_ok(normlab(*cmd[3:], "--master-port", str(free_port())))
    assert_same_curve(run, losses(tiny["ref16"]))
