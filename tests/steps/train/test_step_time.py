"""The roofline step-time estimate (steps/train/step_time.py) on a case small enough to work out by hand, and the
dry run printing it, with the layout over racks and each collective's axis, for every hardware profile."""

from __future__ import annotations

import dataclasses

import pytest

from experiments import hero_535b
from steps.model.model_size import MoeShape
from steps.train.hardware import HARDWARE, Hardware
from steps.train.memory_model import FACTORS, MemoryEstimate
from steps.train.parallelism import ParallelismPlan
from steps.train.step_time import domains_used, estimate_step_time

# d256, 2 global layers, 8 experts of width 64 read d_model (no latent), top-2, no shared experts, 100 tokens a
# sequence; 8 devices in racks of 4 (data 2 x expert 4), 2 sequences each in 2 microbatches, no remat, capacity 1.
SHAPE = MoeShape(d_model=256, n_layers=2, vocab_size=1000, n_heads=2, head_dim=128, kv_heads_local=1,
                 kv_heads_global=1, global_every=1, sliding_window=None, n_experts=8, top_k=2, expert_width=64,
                 latent_dim=None, n_shared_experts=0, shared_width=64, seq_len=100)  # fmt: skip
RACKS = Hardware("racks", "X", peak_flops_per_device=1e12, memory_bytes_per_device=10**9, devices_per_host=1,
                 fast_domain_devices=4, hbm_bytes_per_s=1e11, fast_link_bytes_per_s=1e10,
                 slow_link_bytes_per_s=1e9)  # fmt: skip


def plan(remat: str = "none") -> ParallelismPlan:
    return ParallelismPlan(hardware="racks", hosts=8, devices=8, mesh={"data": 2, "expert": 4}, batch_size=16,
                           microbatch=1, remat=remat, capacity_factor=1.0, memory=MemoryEstimate(0, 0, 0, 0),
                           memory_limit_bytes=10**9, fits=True)  # fmt: skip


def test_the_step_time_estimate_on_two_racks_is_the_hand_computed_roofline() -> None:
    # Parameters: attention 2*256*256 + 2*256*128 = 196,608 a layer; router 2,048 and norms 512; a routed expert
    # 3*256*64 = 49,152; embeddings 2*1000*256 = 512,000; the final norm 256.
    dense = 2 * (196_608 + 2_048 + 512) + 256 + 512_000  # 910,592: split over all 8 devices
    routed = 2 * 2 * 49_152  # each device's 2 experts of each layer: 196,608, split over data (2)
    held = (dense + 2 * 8 * 49_152) / 8  # 212,128 parameters a device holds
    # FLOPs a token: 6 x active (2 x (199,168 + 2 x 49,152) + 256 = 595,200) + 6*256*1000 + 2 layers x 12*100*256.
    model_flops = 200 * (6 * 595_200 + 6 * 256 * 1000 + 2 * 12 * 100 * 256)  # 200 tokens a device
    # HBM per pass (100 tokens): weights read forward and backward in bf16; each layer's working set (stream 256,
    # q/k/v 512, routed copies 2 x (256 + 64)) written and read; the logits 4 times; the f32 gradient accumulator.
    working = 100 * 2 * (FACTORS.stream * 256 + FACTORS.attention * 512 + FACTORS.routed * 2 * 320)
    per_pass = 2 * 2 * (dense + routed) + 2 * 2 * working + 4 * 100 * 1000 * 2 + 2 * 4 * held
    hbm = 2 * per_pass + 28 * held
    # All-to-all: 200 tokens x 2 copies x 256 wide x bf16, to and back, forward and backward, 2 layers; 3/4 leave.
    all_to_all = 200 * 2 * 256 * 2 * 2 * 2 * 2 * 3 / 4
    # Gathers (2 a pass, bf16) and reduce-scatters (1 a pass, f32), 2 passes: dense over data x expert, across the
    # 2 racks hierarchically (a quarter of it crosses, half of that is on the other rack; 3/4 of it fast); routed
    # over data only: half of it from the other rack.
    dense_bytes = dense * (2 * 2 * 2 + 2 * 4)
    routed_bytes = routed * (2 * 2 * 2 + 2 * 4)
    fast = dense_bytes * 3 / 4
    slow = dense_bytes / 4 / 2 + routed_bytes / 2
    estimate = estimate_step_time(SHAPE, plan(), RACKS)
    assert estimate.matmul_s == pytest.approx(model_flops / 1e12, rel=1e-12)
    assert estimate.hbm_s == pytest.approx(hbm / 1e11, rel=1e-12)
    assert estimate.all_to_all_s == pytest.approx(all_to_all / 1e10, rel=1e-12)
    assert estimate.fsdp_s == pytest.approx(max(fast / 1e10, slow / 1e9), rel=1e-12)
    step = max(model_flops / 1e12, hbm / 1e11, fast / 1e10, slow / 1e9) + all_to_all / 1e10
    assert estimate.step_s == pytest.approx(step, rel=1e-12)
    assert estimate.mfu == pytest.approx(model_flops / 1e12 / step, rel=1e-12)
    assert estimate.tokens_per_s == pytest.approx(1600 / step, rel=1e-12)
    by_name = {c.name: (c.axis, c.crosses_domains, c.overlapped) for c in estimate.collectives}
    assert by_name == {
        "all-to-all of routed copies": ("expert", False, False),
        "all-gather of dense weights": ("data x expert", True, True),
        "all-gather of routed experts": ("data", True, True),
        "reduce-scatter of dense gradients": ("data x expert", True, True),
        "reduce-scatter of routed gradients": ("data", True, True),
    }
    assert domains_used(plan(), RACKS) == (2, 4)


def test_a_recomputed_forward_on_racks_costs_a_third_of_the_layers_flops_and_one_more_gather_and_all_to_all() -> None:
    kept, recomputed = estimate_step_time(SHAPE, plan("none"), RACKS), estimate_step_time(SHAPE, plan("layer"), RACKS)
    layer_flops = 200 * (6 * 595_200 + 2 * 12 * 100 * 256) / 3
    assert recomputed.matmul_s - kept.matmul_s == pytest.approx(layer_flops / 1e12, rel=1e-12)
    assert recomputed.all_to_all_s == pytest.approx(kept.all_to_all_s * 3 / 2, rel=1e-12)


def test_inside_one_rack_nothing_crosses_and_an_evaluation_has_no_estimate() -> None:
    one_rack = Hardware("rack", "X", 1e12, 10**9, 1, 8, 1e11, 1e10, 1e9)
    estimate = estimate_step_time(SHAPE, plan(), one_rack)
    assert not any(c.crosses_domains or c.slow_bytes for c in estimate.collectives)
    dense = 2 * (196_608 + 2_048 + 512) + 256 + 512_000
    gathers = next(c for c in estimate.collectives if c.name == "all-gather of dense weights")
    assert gathers.fast_bytes == pytest.approx(dense * 2 * 2 * 2 * 7 / 8, rel=1e-12)
    with pytest.raises(ValueError, match="train steps"):
        estimate_step_time(SHAPE, dataclasses.replace(plan(), training=False), one_rack)


@pytest.mark.parametrize("hardware", sorted(HARDWARE))
def test_the_dry_run_prints_the_rack_layout_each_collective_and_the_estimate(hardware, capsys) -> None:
    dag = hero_535b.build_dag(hero_535b.full_scale(HARDWARE[hardware]))
    hero_535b.print_totals(hero_535b.full_scale(HARDWARE[hardware]), dag)
    printed = capsys.readouterr().out
    assert printed.count("estimate (roofline, not measured)") == 5
    assert printed.count("all-to-all of routed copies") == 5 and "layout: " in printed
    if hardware == "gb200":  # the hero's 16 racks: data crosses them, expert never does
        assert "layout: 16 fast domain(s) of 72 gb200s, 64 devices used in each" in printed
        assert "all-gather of routed experts         on domain x data            crosses domains" in printed
        assert "all-to-all of routed copies          on expert                   inside a domain" in printed
