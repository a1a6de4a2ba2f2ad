"""steps/model/expert_parallel.py on four fake CPU devices (a subprocess per kernel, for every capacity factor its
tests read: the device count is fixed when JAX starts): the routed experts split over an `expert` axis equal a numpy
reference and move tokens only by all-to-all (dropless, or with a capacity: then the all-to-alls carry the slot grid
and drop what one device drops), and a tiny hero-shaped MoE (latent, shared and sigmoid-combined experts, local and
global layers, router-bias balancing) trains through Levanter's `Trainer` on the train step's data=2 x expert=2 layout
as on one device, each device holding half the experts (and half their width, FSDP over `data`), with no collective
but the two all-to-alls carrying anything of the batch's size (activations, router logits). On data=1 x expert=4 and
data=2 x expert=2 each device holds a quarter of every weight, of its AdamW moments and of its gradient, the dense
ones split over every device."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
from paths import REPO, SUPPORT

pytestmark = pytest.mark.training


KERNEL = textwrap.dedent(r"""
    import json, os, re, sys
    from executor.run.collector import collect_rarely
    from executor.run.cpu_devices import with_stand_in_flags
    collect_rarely()
    os.environ["XLA_FLAGS"] = with_stand_in_flags("--xla_force_host_platform_device_count=4")
    import jax, numpy as np
    from steps.model.expert_parallel import capacity_groups, routed_experts
    from steps.model.model_size import DROPLESS_ROUND_FACTOR
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "expert"))
    tokens, feature, width, experts, top_k, seq = 256, 32, 16, 8, 2, 32
    for argument in sys.argv[1:]:  # one process for every factor: each start imports JAX
        factor = None if argument == "none" else float(argument)
        grid = capacity_groups(DROPLESS_ROUND_FACTOR if factor is None else factor, seq, top_k, experts)
        capacity = None if factor is None else grid
        rng = np.random.default_rng(0)
        x = rng.normal(size=(tokens, feature)).astype(np.float32)
        # Skewed routing: experts 0 and 1 are chosen far more than a fair share, so a capacity drops copies.
        chosen = np.stack([rng.choice(experts, top_k, replace=False, p=np.r_[[0.3, 0.3], [0.4 / 6] * 6])
                           for _ in range(tokens)]).astype(np.int32)
        weights = rng.random((tokens, top_k)).astype(np.float32)
        gate, up = (rng.normal(size=(experts, feature, width)).astype(np.float32) * 0.1 for _ in range(2))
        down = rng.normal(size=(experts, width, feature)).astype(np.float32) * 0.1
        run = jax.jit(lambda *a: routed_experts(mesh, a[0], a[1], a[2], (a[3], a[4]), a[5], jax.nn.silu, grid,
                                                dropless=factor is None))
        args = (x, chosen, weights, gate, up, down)
        # Reference: an expert serves the first `slots` copies of each sequence (token order), the rest get nothing.
        kept = np.ones((tokens, top_k), bool)
        served = np.zeros((tokens // seq, experts), int)
        for token in range(tokens):
            for slot in range(top_k):
                served[token // seq, chosen[token, slot]] += 1
                kept[token, slot] = capacity is None or served[token // seq, chosen[token, slot]] <= capacity.slots
        hidden = np.einsum("tf,tkfw->tkw", x, gate[chosen]), np.einsum("tf,tkfw->tkw", x, up[chosen])
        swiglu = hidden[0] / (1 + np.exp(-hidden[0])) * hidden[1]
        expected = np.einsum("tkw,tkwf,tk->tf", swiglu, down[chosen], weights * kept)
        hlo = run.lower(*args).compile().as_text()
        ops = re.findall(r"= (\([^()]*\)|[a-z0-9]+\[[0-9,]*\]\S*) (all-gather|all-to-all|all-reduce|reduce-scatter|"
                         r"collective-permute)(?:-start)?\(", hlo)
        shapes = [[op, shape] for values, op in ops for shape in re.findall(r"[a-z0-9]+\[[0-9,]*\]", values)]
        out, dropped = run(*args)
        print("RESULT " + json.dumps([argument, {
            "error": float(np.abs(np.asarray(out) - expected).max()), "shapes": shapes,
            "ops": [op for _, op in ops], "dropped": int((~kept).sum()),
            "dropped_per_token": np.asarray(dropped).tolist(), "expected_per_token": (~kept).sum(1).tolist(),
            "rounds": int(-(-served.max() // grid.slots))}]))
""")


def results(*command: str) -> list:
    """What the command printed on its `RESULT ` lines, in order."""
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=2400, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-4000:]
    return [json.loads(line.removeprefix("RESULT ")) for line in lines]


KERNEL_FIGURES: dict[tuple[str, str], dict] = {}


def kernel_figures(kernel: str, factor: str) -> dict:
    """The figures `kernel` (KERNEL or EVAL_KERNEL) printed for `factor`, from one subprocess per kernel for every
    factor its tests read (each start imports JAX, and the eval kernel Levanter: ~8 CPU seconds)."""
    if (kernel, factor) not in KERNEL_FIGURES:
        factors = KERNEL_FACTORS[kernel]
        found = dict(results("-c", kernel, *factors))
        assert sorted(found) == sorted(factors), found.keys()
        KERNEL_FIGURES.update({(kernel, each): figures for each, figures in found.items()})
    return KERNEL_FIGURES[(kernel, factor)]


def test_dropless_routed_experts_split_over_the_expert_axis_equal_numpy_in_rounds_of_the_slot_grid() -> None:
    """Dropless: every copy served, in rounds of the slot grid (8 experts x 2 sequences x 10 slots of 32
    features: `DROPLESS_ROUND_FACTOR` 1.25 of a fair share), as many as the fullest (expert, sequence) cell of
    the skewed routing needs; the only other collective is the all-reduce (max) of that count, one integer."""
    kernel = kernel_figures(KERNEL, "none")
    assert kernel["error"] < 1e-5
    assert kernel["rounds"] >= 2 and kernel["dropped"] == 0 and not any(kernel["dropped_per_token"])
    assert set(kernel["ops"]) == {"all-to-all", "all-reduce"}
    moved = [math.prod(dims(shape)) for op, shape in kernel["shapes"] if op == "all-to-all"]
    assert sum(moved) == 2 * 8 * 2 * 10 * 32, kernel["shapes"]  # one round to the experts and back
    assert [shape for op, shape in kernel["shapes"] if op == "all-reduce"] == ["s32[]"]


def test_with_capacity_the_all_to_alls_carry_the_slot_grid_and_drop_as_one_device_does() -> None:
    """Each device's send buffer is its slot grid (8 experts x 2 sequences x 6 slots of 32 features: capacity
    factor 0.75 of a fair share), not every copy per destination (2 x 128 rows); the output equals the
    reference that drops, per sequence, each expert's copies past its slots (the one-device layer's rule,
    tests/steps/model/test_moe_model.py), here dropping a good share of them."""
    kernel = kernel_figures(KERNEL, "0.75")
    assert kernel["dropped"] > 50 and kernel["dropped_per_token"] == kernel["expected_per_token"]
    assert kernel["error"] < 1e-5
    assert set(kernel["ops"]) == {"all-to-all"}
    moved = [math.prod(dims(shape)) for _, shape in kernel["shapes"]]
    assert sum(moved) == 2 * 8 * 2 * 6 * 32, kernel["shapes"]  # to the experts and back: the grid, nothing else


EVAL_KERNEL = textwrap.dedent(r"""
    import json, os, re, sys
    from executor.run.collector import collect_rarely
    from executor.run.cpu_devices import with_stand_in_flags
    collect_rarely()
    os.environ["XLA_FLAGS"] = with_stand_in_flags("--xla_force_host_platform_device_count=4")
    import equinox as eqx, haliax as hax, jax, jax.numpy as jnp, numpy as np
    from levanter.utils.tree_utils import inference_mode
    from steps.model.moe_block import DROPPED_COPIES, MoeBlock
    from steps.model.moe_model import MoeConfig

    def elements(op):  # of every array a (tuple-valued) collective moves
        return sum(int(np.prod([int(size) for size in dims.split(",")])) for dims in re.findall(r"\[([0-9,]+)\]", op))

    def relative_error(ours, reference):
        return float(np.abs(ours - reference).max() / (np.abs(reference).max() + 1e-12))

    for argument in sys.argv[1:]:  # one process for every factor: each start imports JAX
        factor = None if argument == "none" else float(argument)
        config = MoeConfig(max_seq_len=64, hidden_dim=32, intermediate_dim=16, moe_intermediate_dim=16, num_layers=1,
                           num_heads=2, head_dim=16, num_kv_heads=1, num_experts=8, num_experts_per_tok=2,
                           router_aux_loss_coef=None, capacity_factor=factor, tokenizer="unused",
                           reference_checkpoint="unused")
        x = hax.random.normal(jax.random.PRNGKey(1), (hax.Axis("batch", 8), hax.Axis("position", 64), config.Embed))
        block = MoeBlock.init(config, key=jax.random.PRNGKey(0))
        # Experts 0 and 1 favoured by every token: a capacity drops copies, dropless needs several rounds.
        favour = hax.named(jnp.where(jnp.arange(8)[:, None] < 2, 0.5, 0.0) * jnp.ones((8, 32)),
                           block.gate.weight.axes)
        block = inference_mode(eqx.tree_at(lambda b: b.gate.weight, block, block.gate.weight + favour), True)
        params, static = eqx.partition(block, eqx.is_array)

        def forward(params, x):
            out, extras = eqx.combine(params, static)(x)
            return out.array, extras[DROPPED_COPIES].array if DROPPED_COPIES in extras else jnp.zeros((8, 64), int)

        figures = {}
        for label, expert, count in (("1", 1, 1), ("data4", 1, 4), ("2", 2, 4), ("4", 4, 4)):
            devices = jax.devices()[:count]
            mesh = jax.sharding.Mesh(np.array(devices).reshape(-1, expert), ("data", "expert"))
            mapping = {"batch": ("data", "expert"), "experts": "expert"}
            with hax.partitioning.set_mesh(mesh), hax.axis_mapping(mapping):
                on_mesh = hax.shard(params), hax.shard(x)
                compiled = jax.jit(forward).lower(*on_mesh).compile()
                out, dropped = compiled(*on_mesh)
                grads = jax.jit(jax.grad(lambda p, x: jnp.sum(jnp.sin(forward(p, x)[0]))))(*on_mesh)
            ops = re.findall(r"= (\([^()]*\)|[a-z0-9]+\[[0-9,]*\]\S*) all-to-all\(", compiled.as_text())
            figures[label] = {"out": np.asarray(out), "dropped": np.asarray(dropped),
                               "all_to_all": list(map(elements, ops)),
                               "grads": [np.asarray(leaf) for leaf in jax.tree.leaves(grads)],
                               "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes)}
        one = figures["1"]
        print("RESULT " + json.dumps([argument, {expert: {
            "error": float(np.abs(f["out"] - one["out"]).max()),
            "grad_error": max(relative_error(ours, theirs) for ours, theirs in zip(f["grads"], one["grads"])),
            "dropped": int(f["dropped"].sum()), "same_drops": bool((f["dropped"] == one["dropped"]).all()),
            "all_to_all": f["all_to_all"], "temp_bytes": f["temp_bytes"]} for expert, f in figures.items()}]))
""")


KERNEL_FACTORS = {KERNEL: ("none", "0.75"), EVAL_KERNEL: ("none", "1.15")}
"""The capacity factors each kernel's tests read ("none": dropless)."""


@pytest.mark.parametrize(("factor", "slots"), [("none", 20), ("1.15", 19)])
def test_eval_on_ep2_and_ep4_equals_one_device_and_sends_the_slot_grid_not_s_times_the_copies(factor, slots) -> None:
    """The MoE block in eval (`inference_mode`) on data x expert meshes of four devices, EP 2 and 4, against one
    device: dropless (rounds of a 1.25-share grid) and with the hero's capacity factor 1.15 (evaluation drops as
    training does), equal outputs, dropped copies and gradients (the rounds' own backward pass). Each device
    holds 2 sequences of 64 tokens (128 tokens, 256 copies); every all-to-all of the compiled eval program
    carries that device's slot grid, 8 experts x 2 sequences x `slots` x 32 features, whatever S, and XLA's
    temporary buffers are a few grids (100-127 kB), where the eval of commit 3ce6043 (dropless, whatever the
    capacity factor) sent S x 256 copies x 32 features (16,384 floats at EP 2, 32,768 at EP 4) in 451 kB and
    582 kB of temporaries."""
    figures = kernel_figures(EVAL_KERNEL, factor)
    grid = 8 * 2 * slots * 32
    for expert in ("2", "4"):
        on_mesh = figures[expert]
        assert on_mesh["error"] < 1e-5 and on_mesh["grad_error"] < 1e-5, on_mesh
        assert on_mesh["same_drops"] and on_mesh["dropped"] == figures["1"]["dropped"]
        assert on_mesh["all_to_all"] and set(on_mesh["all_to_all"]) == {grid}, on_mesh["all_to_all"]
        assert on_mesh["temp_bytes"] <= 4 * grid * 4, on_mesh  # a few grids of f32 at most
    assert (figures["1"]["dropped"] > 20) == (factor != "none")
    # Four devices of data parallelism, no expert axis: the same outputs, drops and gradients, no all-to-all, and
    # (with a capacity) each device fills its own sequences' grid, where commit cd5c2f5 built the whole batch's
    # (8 experts x 8 sequences x 19 slots) on every device: 330 kB of temporaries, one device's whole batch's (334
    # kB), against 94 kB now.
    data_only = figures["data4"]
    assert data_only["error"] < 1e-5 and data_only["grad_error"] < 1e-5, data_only
    assert data_only["same_drops"] and data_only["dropped"] == figures["1"]["dropped"] and not data_only["all_to_all"]
    if factor != "none":
        assert data_only["temp_bytes"] <= 4 * grid * 4, data_only


TRAINED: dict[int, dict] = {}


def trained_on(devices: int) -> dict:
    """tests/support/expert_parallel_run.py's hero-shaped run and layout runs on `devices`, one subprocess for both
    trainer tests (JAX and Levanter start once a device count; one device trains the latent model once)."""
    if devices not in TRAINED:
        TRAINED[devices] = results(str(SUPPORT / "expert_parallel_run.py"), str(devices), "both")[-1]
    return TRAINED[devices]


@pytest.mark.slow
@pytest.mark.timeout(3000)  # two processes through Levanter's trainer: 20 minutes on 2 busy cores
def test_a_tiny_hero_shaped_moe_trains_on_data2_x_expert2_as_on_one_device() -> None:
    """With the hero's capacity factor 1.15 one device and the mesh run the same slot grid, so their sums differ
    only in order. (Dropless, one device runs a grouped matmul and the mesh rounds of the grid: with router-bias
    balancing on, their rounding differences flip a top-k choice within a few steps, 6e-4 to 4e-3 apart by step
    5; the dropless layer itself equals one device's to 1e-6, test_eval_on_ep2_and_ep4_*.)"""
    one, four = (trained_on(devices)["run"] for devices in (1, 4))
    assert four["losses"] == pytest.approx(one["losses"], abs=1e-4)
    # Half the experts per device (split over `expert`), half their hidden width (FSDP over `data`).
    assert four["expert_bytes_per_device"] * 4 == four["expert_bytes"] == one["expert_bytes_per_device"]
    # The slot grid: a destination's block is its 4 experts x 2 sequences (8 x 32 positions over 4 devices) x 10
    # slots (ceil(1.15 x a fair share of 32 x top-2 / 8)) of the latent 16.
    # XLA also moves small per-token arrays between the layouts of the grid's indices by all-to-alls; none carries
    # more than the grid.
    dispatches = {op["shape"] for op in four["collectives"] if op["op"] == "all-to-all"}
    assert "f32[1,4,20,16]" in dispatches, four["collectives"]
    assert all(math.prod(dims(shape)) <= 4 * 20 * 16 for shape in dispatches), dispatches
    # No collective gathers the batch's activations (256 tokens x d_model 32, or x the latent 16) onto a device,
    # nor its router logits or scores (256 tokens x 8 experts, in any layout): top-k runs on each device's own
    # tokens and the bias rule's quantile all-reduces counts per expert. (A psum XLA keeps over a mesh axis of
    # size 1, a group of one device, moves nothing.)
    moving = [op for op in four["collectives"] if op["op"] != "all-to-all" and op["group"] > 1]
    gathered = [op["shape"] for op in moving]
    assert not [shape for shape in gathered if shape.startswith(("f32[256,32]", "f32[256,16]"))], gathered
    logits = [op for op in moving if 256 in dims(op["shape"]) or math.prod(dims(op["shape"])) == 256 * 8]
    assert not logits, four["collectives"]


ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
DENSE = (*ATTENTION, "token_embeddings", "lm_head", "transformer.norm", "layernorm", "mlp.gate.", "mlp.shared.")
ROUTED = ("mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.down_proj")


@pytest.mark.slow
@pytest.mark.timeout(3000)  # the processes above (run first alone: 20 minutes on 2 busy cores)
def test_every_weight_its_moments_and_gradient_are_split_over_every_device_and_train_as_on_one_device() -> None:
    """On data=1 x expert=4 (a latent MoE) and data=2 x expert=2 (a plain MoE, whose routed experts read d_model:
    `embed` there meets `experts`), each device holds a quarter of every weight, of its AdamW
    moments and of its gradient: dense weights (attention, embeddings, LM head, norms, router, shared experts,
    latent projections) over data x expert, routed experts over `expert` and FSDP over `data`. Only the router
    bias and loads (carried, not trained) are split over `expert` alone. The losses are the one-device run's (with
    the hero's capacity, where both run the same slot grid).
    (With dense weights FSDP over `data` alone, as before issue 35, a device held them whole on data=1 x
    expert=4 and half of them on data=2 x expert=2.)"""
    one = {run["model"]: run for run in trained_on(1)["layout"]}
    four = trained_on(4)["layout"]
    cases = [(run["mesh"]["data"], run["model"]) for run in four]  # data=1 x expert=4, then data=2 x expert=2
    assert cases[:2] == [(1, "latent"), (2, "plain")]  # the third, two racks, is the next test's
    for run in four[:2]:
        label = f"{run['mesh']} {run['model']}"
        assert run["losses"] == pytest.approx(one[run["model"]]["losses"], abs=1e-4), label
        trained = [path for path in run["params"] if ".balance." not in path]
        kinds = DENSE + ROUTED + (("mlp.latent_in", "mlp.latent_out") if run["model"] == "latent" else ())
        assert all(any(kind in path for path in trained) for kind in kinds), (label, trained)
        for part in ("params", "mu", "nu", "grads"):
            shares = {path: math.prod(held) / math.prod(whole) for path, (whole, held) in run[part].items()}
            assert {path: shares[path] for path in trained if shares[path] != 0.25} == {}, (label, part)
        carried = [held[-1] / whole[-1] for path, (whole, held) in run["params"].items() if ".balance.bias" in path]
        assert set(carried) == {1 / run["mesh"]["expert"]}, label


@pytest.mark.slow
@pytest.mark.timeout(3000)  # the processes above
def test_two_racks_train_as_one_data_axis_and_the_slot_grid_never_leaves_a_rack() -> None:
    """domain=2 x data=1 x expert=2, two racks of two devices (the hero's 16 racks x EP64, scaled down): `domain` is
    the mesh's outermost axis, each rack a block of consecutive devices, the batch split over domain x data x expert,
    and the run trains to data=2 x expert=2's losses (the same layout, its data axis named for the racks). Every
    all-to-all that carries the slot grid (a destination's 4 experts x 2 sequences x 10 slots x d_model 32) stays
    inside a rack. Measured: XLA also re-lays the router's per-token scores (a device's 64 tokens x 8 experts) by
    all-to-alls over domain x expert, which cross racks; nothing larger does."""
    four = trained_on(4)["layout"]
    flat, racked = four[1], four[2]
    assert (racked["mesh"], racked["model"]) == ({"domain": 2, "data": 1, "expert": 2}, "plain")
    assert racked["losses"] == pytest.approx(flat["losses"], abs=1e-6)
    layout = racked["racks"]
    # Levanter's size-1 axes (replica, model, replica_dcn) aside: domain outermost, expert innermost.
    assert [axis for axis in layout["axis_names"] if axis in racked["mesh"]] == ["domain", "data", "expert"]
    assert layout["axis_names"][0] == "domain", layout["axis_names"]
    assert layout["domains"] == [[0, 1], [2, 3]]
    assert layout["batch_axes"] == ["domain", "data", "expert"]
    rack_of = {device: rack for rack, devices in enumerate(layout["domains"]) for device in devices}

    def crosses_racks(op: dict) -> bool:
        return any(len({rack_of[device] for device in group}) > 1 for group in op["groups"])

    grid = [op for op in layout["all_to_all"] if any(math.prod(dims(shape)) == 4 * 20 * 32 for shape in op["shapes"])]
    assert grid and not [op for op in grid if crosses_racks(op)], layout["all_to_all"]
    tokens, experts = 8 * 32 // 4, 8  # expert_parallel_run's batch of 8 x 32 positions over 4 devices; its experts
    crossing = [shape for op in layout["all_to_all"] if crosses_racks(op) for shape in op["shapes"]]
    assert all(math.prod(dims(shape)) <= tokens * experts for shape in crossing), crossing


def dims(shape: str) -> list[int]:
    """`f32[256,8]` -> [256, 8]."""
    return [int(dim) for dim in shape[shape.index("[") + 1 : -1].split(",") if dim]
