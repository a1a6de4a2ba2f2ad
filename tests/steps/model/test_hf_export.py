"""steps/model/hf_export.py on the hero's architecture in small (test_moe_architecture.py's five layers: a
scanned period local, local, global and a tail local, global; local layers with two KV heads, global with one;
latent experts; two shared experts), with a non-zero router bias and expert loads: config.json, the tensors
against the calculator, the exact round trip, the export from a Levanter checkpoint, and broken folders.

Expert and shared widths differ from every other width here, so a transposed tensor cannot pass for another."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from levanter.checkpoint import save_checkpoint
from mixing_fixtures import write_hf_tokenizer
from test_moe_architecture import HERO_SHAPE, hero_config
from test_moe_model import SEQ, VOCAB, Vocab, batches, mesh  # noqa: F401 (mesh: a fixture)

from steps.model.hf_export import (
    CONFIG_FILE,
    INDEX_FILE,
    WEIGHTS_FILE,
    HfExportError,
    export_checkpoint,
    export_model,
    load_hf_export,
    model_tensors,
    moe_config,
    shard_plan,
)
from steps.model.model_size import MoeShape, total_params
from steps.model.moe_model import MoeLMHeadModel
from steps.model.router_balance import ExcessBin, RouterBalance

pytestmark = pytest.mark.training

SHAPE = dataclasses.replace(HERO_SHAPE, expert_width=24, shared_width=12)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def with_router_state(model: MoeLMHeadModel, seed: int) -> MoeLMHeadModel:
    """Every layer's router bias random (it changes routing) and its loads positive, as after training, with an
    empty histogram (so the model routes by this bias, as a settled state does)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 64))

    def fill(node: object) -> object:
        if not isinstance(node, RouterBalance):
            return node
        bias = hax.random.normal(next(keys), node.bias.axes)
        return dataclasses.replace(node, bias=bias, load=hax.random.uniform(next(keys), node.load.axes) * 100)

    return jax.tree.map(fill, model, is_leaf=lambda node: isinstance(node, RouterBalance))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_hf_tokenizer(tmp_path_factory.mktemp("tokenizer"), ["def f(x):\n    return x + 1\n"] * 4, 300)


@pytest.fixture(scope="module")
def model() -> MoeLMHeadModel:
    return with_router_state(hero_config(SHAPE).build(Vocab, key=jax.random.PRNGKey(0)), seed=1)


@pytest.fixture(scope="module")
def exported(model: MoeLMHeadModel, tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("export") / "hf"
    export_model(model, str(folder), tokenizer)
    return folder


def expected_shapes(shape: MoeShape) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape the module docstring promises, written out from the shape."""
    d, head, experts = shape.d_model, shape.head_dim, shape.n_experts
    latent, width, shared = shape.latent_dim or d, shape.expert_width, shape.n_shared_experts * shape.shared_width
    shapes = {"model.embed_tokens.weight": (shape.vocab_size, d), "model.norm.weight": (d,)}
    if not shape.tied_embeddings:
        shapes["lm_head.weight"] = (shape.vocab_size, d)
    for index in range(shape.n_layers):
        layer = f"model.layers.{index}"
        kv_heads = shape.kv_heads_global if shape.is_global(index) else shape.kv_heads_local
        shapes |= {
            f"{layer}.input_layernorm.weight": (d,),
            f"{layer}.post_attention_layernorm.weight": (d,),
            f"{layer}.self_attn.q_proj.weight": (shape.n_heads * head, d),
            f"{layer}.self_attn.k_proj.weight": (kv_heads * head, d),
            f"{layer}.self_attn.v_proj.weight": (kv_heads * head, d),
            f"{layer}.self_attn.o_proj.weight": (d, shape.n_heads * head),
            f"{layer}.mlp.gate.weight": (experts, d),
            f"{layer}.mlp.latent_in.weight": (latent, d),
            f"{layer}.mlp.latent_out.weight": (d, latent),
            f"{layer}.mlp.shared.gate_proj.weight": (shared, d),
            f"{layer}.mlp.shared.up_proj.weight": (shared, d),
            f"{layer}.mlp.shared.down_proj.weight": (d, shared),
            f"{layer}.mlp.balance.bias": (experts,),
            f"{layer}.mlp.balance.load": (experts,),
            f"{layer}.mlp.balance.excess": (experts, ExcessBin.size),
        }
        for expert in range(experts):
            prefix = f"{layer}.mlp.experts.{expert}"
            shapes[f"{prefix}.gate_proj.weight"] = shapes[f"{prefix}.up_proj.weight"] = (width, latent)
            shapes[f"{prefix}.down_proj.weight"] = (latent, width)
    return shapes


def test_config_json_holds_every_architecture_field(exported: Path) -> None:
    config = json.loads((exported / CONFIG_FILE).read_text())
    expected = {
        "architectures": ["MoeLMHeadModel"],
        "model_type": "moe_balanced",
        "vocab_size": VOCAB,
        "torch_dtype": "float32",
        "hidden_size": 32,
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "head_dim": 8,
        "num_key_value_heads": 1,
        "num_kv_heads_local": 2,
        "global_every": 3,
        "sliding_window": 8,
        "expert_latent_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "num_shared_experts": 2,
        "shared_expert_intermediate_size": 12,
        "max_position_embeddings": SEQ,
        "rope_theta": 1e6,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "use_qk_norm": False,
        "hidden_act": "silu",
        "router_bias_balancing": True,
        "router_z_loss_weight": 1e-3,
        "levanter_version": metadata.version("marin-levanter"),
        "haliax_version": metadata.version("marin-haliax"),
    }
    assert {key: config.get(key) for key in expected} == expected
    assert config["layer_types"] == ["sliding_attention"] * 2 + [
        "full_attention",
        "sliding_attention",
        "full_attention",
    ]
    # Every field of the config trained comes back; only the run-time choices take their defaults.
    trained = hero_config(SHAPE)
    rebuilt = moe_config(config, str(exported))
    run_time = {
        name: getattr(trained, name) for name in ("tokenizer", "reference_checkpoint", "gradient_checkpointing")
    }
    assert dataclasses.replace(rebuilt, **run_time) == trained


def test_tensors_are_per_layer_and_add_up_to_the_calculators_count(exported: Path, tokenizer: str) -> None:
    tensors = safetensors.numpy.load_file(exported / WEIGHTS_FILE)
    expected = expected_shapes(SHAPE)
    assert {name: tensor.shape for name, tensor in tensors.items()} == expected
    assert len(tensors) == 3 + SHAPE.n_layers * (15 + 3 * SHAPE.n_experts)
    weights = sum(tensor.size for name, tensor in tensors.items() if ".mlp.balance." not in name)
    assert weights == total_params(SHAPE)
    assert {tensor.dtype for tensor in tensors.values()} == {np.dtype(np.float32)}
    for name in TOKENIZER_FILES:  # the folder is self-contained
        assert (exported / name).read_bytes() == (Path(tokenizer) / name).read_bytes()


def test_round_trip_gives_identical_logits_and_router_state(model: MoeLMHeadModel, exported: Path) -> None:
    loaded = load_hf_export(str(exported))
    tokens = batches(1)[0].tokens
    logits = eqx.filter_jit(lambda m: m(tokens).array)
    np.testing.assert_array_equal(np.asarray(logits(loaded)), np.asarray(logits(model)))
    for original, restored in zip(
        model.transformer.layers_in_order(), loaded.transformer.layers_in_order(), strict=True
    ):
        for state in ("bias", "load"):
            expected = getattr(original.mlp.balance, state).array
            np.testing.assert_array_equal(np.asarray(getattr(restored.mlp.balance, state).array), expected)
    # The bias routes: the same weights with a zero bias give other logits, so a dropped bias would show.
    unbiased = jax.tree.map(
        lambda node: (
            dataclasses.replace(node, bias=hax.zeros_like(node.bias)) if isinstance(node, RouterBalance) else node
        ),
        loaded,
        is_leaf=lambda node: isinstance(node, RouterBalance),
    )
    assert not np.allclose(np.asarray(logits(unbiased)), np.asarray(logits(model)))


def test_an_export_holds_the_bias_the_model_routes_by_next(model: MoeLMHeadModel, tokenizer: str, tmp_path: Path):
    """A trained model's router state holds the last batch's histogram, which moves the bias the next batch is
    routed by; the export writes that bias with an empty histogram: the same routing, from the bias alone."""
    keys = iter(jax.random.split(jax.random.PRNGKey(6), 64))

    def count(node: object) -> object:
        if not isinstance(node, RouterBalance):
            return node
        return dataclasses.replace(node, excess=hax.random.randint(next(keys), node.excess.axes, 0, 5) * 1.0)

    counted = jax.tree.map(count, model, is_leaf=lambda node: isinstance(node, RouterBalance))
    export_model(counted, str(tmp_path), tokenizer)
    loaded = load_hf_export(str(tmp_path))
    tokens = batches(1)[0].tokens
    logits = eqx.filter_jit(lambda m: m(tokens).array)
    np.testing.assert_array_equal(np.asarray(logits(loaded)), np.asarray(logits(counted)))
    assert not np.allclose(np.asarray(logits(loaded)), np.asarray(logits(model)))  # the histogram moved the bias
    layers = zip(counted.transformer.layers_in_order(), loaded.transformer.layers_in_order(), strict=True)
    for trained, restored in layers:
        expected = np.asarray(trained.mlp.balance.routing_bias().array)
        np.testing.assert_allclose(np.asarray(restored.mlp.balance.bias.array), expected, rtol=1e-6, atol=1e-7)
        assert not np.any(np.asarray(restored.mlp.balance.excess.array))


def test_a_tied_bfloat16_model_round_trips_in_bfloat16(tokenizer: str, tmp_path: Path) -> None:
    shape = dataclasses.replace(SHAPE, tied_embeddings=True)
    model = with_router_state(hero_config(shape).build(Vocab, key=jax.random.PRNGKey(3)), seed=4)
    model = jax.tree.map(lambda leaf: leaf.astype(jnp.bfloat16) if eqx.is_inexact_array(leaf) else leaf, model)
    config = export_model(model, str(tmp_path), tokenizer)
    assert config["torch_dtype"] == "bfloat16" and config["tie_word_embeddings"]
    restored = model_tensors(load_hf_export(str(tmp_path)))
    assert "lm_head.weight" not in restored and restored.keys() == expected_shapes(shape).keys()
    original = model_tensors(model)
    for name, tensor in original.items():
        assert restored[name].dtype == jnp.bfloat16
        np.testing.assert_array_equal(restored[name], tensor)


def test_export_from_the_latest_complete_checkpoint(model: MoeLMHeadModel, tokenizer: str, tmp_path: Path) -> None:
    """What the train step calls: Levanter's train state holds the model under `model`."""
    checkpoints = tmp_path / "checkpoints"
    earlier = with_router_state(model, seed=5)
    save_checkpoint({"model": earlier}, step=2, checkpoint_path=str(checkpoints / "step-2"), is_temporary=False)
    save_checkpoint({"model": model}, step=5, checkpoint_path=str(checkpoints / "step-5"), is_temporary=False)
    config = dataclasses.replace(hero_config(SHAPE), tokenizer=tokenizer)
    used = export_checkpoint(str(checkpoints), config, VOCAB, str(tmp_path / "hf"))
    assert used.endswith("step-5")
    restored, original = model_tensors(load_hf_export(str(tmp_path / "hf"))), model_tensors(model)
    assert all(np.array_equal(restored[name], tensor) for name, tensor in original.items())
    with pytest.raises(FileNotFoundError, match=re.escape(f"HF export to {tmp_path}/none: no complete checkpoint")):
        export_checkpoint(str(tmp_path / "empty"), config, VOCAB, str(tmp_path / "none"))


def test_weights_past_the_shard_size_are_split_in_depth_order_with_an_index(
    model: MoeLMHeadModel, exported: Path, tokenizer: str, tmp_path: Path
) -> None:
    """HF's layout for a model too large for one file, as `transformers` reads it; re-exporting into the same
    folder with another sharding leaves no file of the earlier export."""
    original = model_tensors(model)
    sizes = {name: tensor.nbytes for name, tensor in original.items()}
    limit = max(sum(sizes.values()) // 5, max(sizes.values()))
    folder = tmp_path / "hf"
    shutil.copytree(exported, folder)  # an earlier one-file export
    export_model(model, str(folder), tokenizer, max_shard_bytes=limit)

    index = json.loads((folder / INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 5
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    assert not (folder / WEIGHTS_FILE).exists()
    assert index["metadata"]["total_size"] == sum(sizes.values())
    assert index["weight_map"].keys() == sizes.keys()
    layer_files: dict[int, set[str]] = {}
    for file in files:
        held = safetensors.numpy.load_file(folder / file)
        assert sum(tensor.nbytes for tensor in held.values()) <= limit
        assert {index["weight_map"][name] for name in held} == {file}
        for name in held:
            if name.startswith("model.layers."):
                layer_files.setdefault(int(name.split(".")[2]), set()).add(file)
    first_files = [min(found) for _, found in sorted(layer_files.items())]
    assert first_files == sorted(first_files) and len(set(first_files)) > 1  # layer i+1 never before layer i
    restored = model_tensors(load_hf_export(str(folder)))
    assert restored.keys() == original.keys()
    assert all(np.array_equal(restored[name], tensor) for name, tensor in original.items())

    export_model(model, str(folder), tokenizer)  # back to one file
    assert (folder / WEIGHTS_FILE).exists() and not (folder / INDEX_FILE).exists()
    assert not list(folder.glob("model-*.safetensors"))


def test_the_shard_plan_closes_a_file_before_it_would_overflow() -> None:
    assert shard_plan({"a": 3, "b": 10, "c": 2, "d": 2, "e": 1}, 5) == [["a"], ["b"], ["c", "d", "e"]]
    assert shard_plan({"a": 3, "b": 2}, 5) == [["a", "b"]]
    with pytest.raises(ValueError, match="max_shard_bytes must be positive"):
        shard_plan({"a": 1}, 0)


@pytest.fixture(scope="module")
def sharded(model: MoeLMHeadModel, tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sharded") / "hf"
    export_model(model, str(folder), tokenizer, max_shard_bytes=40_000)
    return folder


def move_a_tensor_in_the_index(folder: Path) -> None:
    index = json.loads((folder / INDEX_FILE).read_text())
    weight_map = index["weight_map"]
    here = weight_map["model.norm.weight"]
    weight_map["model.norm.weight"] = next(file for file in sorted(weight_map.values()) if file != here)
    (folder / INDEX_FILE).write_text(json.dumps(index))


BROKEN_SHARDED = {
    "a file missing": (
        lambda folder: sorted(folder.glob("model-00002-*"))[0].unlink(),
        r"model\.safetensors\.index\.json names model-00002-of-\d{5}\.safetensors, which is missing",
    ),
    "a tensor in another file than the index says": (
        move_a_tensor_in_the_index,
        r"model-\d{5}-of-\d{5}\.safetensors holds 1 tensor\(s\) model\.safetensors\.index\.json places "
        r"elsewhere or not at all: \['model\.norm\.weight'\]",
    ),
    "no weight map": (lambda folder: (folder / INDEX_FILE).write_text("{}"), r"has no weight_map"),
}


@pytest.mark.parametrize("case", list(BROKEN_SHARDED))
def test_a_broken_sharded_export_is_refused_naming_the_folder(sharded: Path, tmp_path: Path, case: str) -> None:
    assert len(list(sharded.glob("model-*.safetensors"))) >= 3
    assert_refused(sharded, tmp_path, *BROKEN_SHARDED[case])


def assert_refused(export: Path, tmp_path: Path, breaks: Callable[[Path], object], message: str) -> None:
    """A copy of `export`, broken by `breaks`, fails to load with an error naming it and saying `message`."""
    folder = tmp_path / "copy"
    shutil.copytree(export, folder)
    breaks(folder)
    with pytest.raises(HfExportError, match=rf"^{re.escape(str(folder))}: .*{message}"):
        load_hf_export(str(folder))


def drop_config_field(folder: Path) -> None:
    config = json.loads((folder / CONFIG_FILE).read_text())
    del config["expert_latent_dim"]
    (folder / CONFIG_FILE).write_text(json.dumps(config))


def rewrite_tensors(folder: Path, change: dict[str, np.ndarray | None]) -> None:
    tensors = safetensors.numpy.load_file(folder / WEIGHTS_FILE)
    for name, tensor in change.items():
        if tensor is None:
            del tensors[name]
        else:
            tensors[name] = tensor
    safetensors.numpy.save_file(tensors, folder / WEIGHTS_FILE)


BROKEN = {
    "no config.json": (lambda folder: (folder / CONFIG_FILE).unlink(), r"no config\.json"),
    "no weights": (lambda folder: (folder / WEIGHTS_FILE).unlink(), r"no model\.safetensors"),
    "a field missing": (drop_config_field, r"config\.json lacks 'expert_latent_dim'"),
    "another model": (
        lambda folder: (folder / CONFIG_FILE).write_text(json.dumps({"model_type": "qwen3_moe"})),
        r"model_type 'qwen3_moe', not 'moe_balanced'",
    ),
    "a tensor missing": (
        lambda folder: rewrite_tensors(folder, {"model.layers.3.mlp.balance.bias": None}),
        r"1 tensors missing \['model\.layers\.3\.mlp\.balance\.bias'\]",
    ),
    "a global layer with a local layer's KV width": (
        lambda folder: rewrite_tensors(folder, {"model.layers.2.self_attn.k_proj.weight": np.zeros((16, 32))}),
        r"tensor model\.layers\.2\.self_attn\.k_proj\.weight has shape \(16, 32\), but config\.json needs \(8, 32\)",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_export_is_refused_naming_the_folder(exported: Path, tmp_path: Path, case: str) -> None:
    assert_refused(exported, tmp_path, *BROKEN[case])
