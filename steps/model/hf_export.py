"""An HF-style folder of a trained MoE model (steps/model/moe_model.py), complete enough to rebuild it exactly.

No stock Hugging Face architecture holds this model (local/global layers with their own KV widths, latent
experts, shared experts, a carried router bias), and Levanter's Qwen3-MoE converter would silently drop
those parts. So the export has a `model_type` of its own, and `load_hf_export` is the loader that proves it
complete: folder -> `MoeConfig` + weights -> the same Levanter model, with identical logits.

    export_checkpoint(f"{run}/checkpoints", model_config, vocab_size, f"{run}/hf")  # what the train step does
    model = load_hf_export(f"{run}/hf")

The folder holds:

- `config.json`: every `MoeConfig` field that shapes the model, under Qwen3-MoE's HF names where HF has the
  field (`hidden_size`, `num_hidden_layers`, `num_key_value_heads`, `moe_intermediate_size`, `rope_theta`,
  `rope_scaling`, `rms_norm_eps`, `hidden_act`...) and under `MoeConfig`'s own names otherwise
  (`num_kv_heads_local`, `global_every`, `expert_latent_dim`, `num_shared_experts`,
  `router_bias_balancing`...); `vocab_size`, `torch_dtype` (the weights' dtype), `layer_types` (derived,
  for readers: `sliding_attention` / `full_attention` per layer), `architectures`, `model_type`
  ("moe_balanced", Levanter's registry name for `MoeConfig`) and the Levanter and Haliax versions. Run-time
  choices (kernel, scan, rematerialisation, tokenizer path) are left out. Written last: a folder with a
  config.json is complete.
- `model.safetensors`, or past `max_shard_bytes` (5 GB, `transformers`' default) the same tensors split
  in depth order over `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json` (HF's
  layout: `metadata.total_size`, `weight_map` from tensor name to file), which `transformers` and
  `safetensors` users read as is: one tensor per weight in the dtype trained, layers unstacked from Levanter's scanned
  periods and numbered in depth order. Linear weights are (out, in) as in PyTorch; attention heads are
  flattened head-major (grouped by KV head, as Levanter's HF converter writes Qwen3). Names (layer `i`,
  routed expert `j`):

      model.embed_tokens.weight                          (vocab, d_model)
      lm_head.weight                                     (vocab, d_model); absent when tied
      model.norm.weight                                  (d_model)
      model.layers.i.input_layernorm.weight              (d_model)
      model.layers.i.post_attention_layernorm.weight     (d_model)
      model.layers.i.self_attn.{q,o}_proj.weight         (heads*head_dim, d_model) / (d_model, heads*head_dim)
      model.layers.i.self_attn.{k,v}_proj.weight         (kv_heads*head_dim, d_model): the layer's own KV width
      model.layers.i.mlp.gate.weight                     (experts, d_model): the router
      model.layers.i.mlp.latent_in.weight                (latent, d_model); with latent experts only
      model.layers.i.mlp.latent_out.weight               (d_model, latent); with latent experts only
      model.layers.i.mlp.experts.j.{gate,up}_proj.weight (expert_width, latent or d_model)
      model.layers.i.mlp.experts.j.down_proj.weight      (latent or d_model, expert_width)
      model.layers.i.mlp.shared.{gate,up}_proj.weight    (n_shared*shared_width, d_model): the shared experts
      model.layers.i.mlp.shared.down_proj.weight         (d_model, n_shared*shared_width)    as one SwiGLU
      model.layers.i.mlp.balance.bias                    (experts): router bias, added to logits for top-k
      model.layers.i.mlp.balance.load                    (experts): tokens per expert in the last batch
      model.layers.i.mlp.balance.excess                  (experts, 257): zero; the bias is settled

  These are Levanter's own state-dict names (Qwen3-MoE's HF names, plus our modules' field names), so the
  export and the loader are the same mapping read both ways. The weights (all but `balance.*`) add up to
  steps/model/model_size.py's `total_params`. The router state is written settled
  (steps/model/router_balance.py): `bias` is the bias the model routes by next, and the histogram the
  training run would have read it from is left empty, so a reader needs only the bias.
- the tokenizer files of the run (`tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`).

Host memory holds one weights file (and one layer) at a time; the model itself is loaded whole on the
exporting host's devices, as steps/evaluate/evaluate.py loads it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy
from haliax import Axis
from haliax.nn.scan import Stacked
from haliax.partitioning import round_axis_for_partitioning
from haliax.state_dict import from_torch_compatible_state_dict, to_torch_compatible_state_dict
from jax.experimental import multihost_utils
from levanter.layers.rotary import RotaryEmbeddingsConfig
from levanter.models.llama import ActivationFunctionEnum
from levanter.trainer import TrainerConfig

from executor import storage
from steps.model.checkpoints import latest_checkpoint, load_model
from steps.model.moe_layers import MoePeriod, MoeTransformer
from steps.model.moe_model import MoeConfig, MoeLMHeadModel
from steps.model.router_balance import settled
from steps.tokenize.train_tokenizer import SPECIAL_TOKENS_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE

logger = logging.getLogger(__name__)

HF_FOLDER = "hf"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 10**9
"""Weights beyond this are split over several files (`transformers`' `save_pretrained` default, 5 GB)."""
MODEL_TYPE = "moe_balanced"
ARCHITECTURE = "MoeLMHeadModel"

# MoeConfig fields that choose how the model runs, not what it is.
_RUN_TIME_FIELDS = frozenset(
    [
        "tokenizer",
        "reference_checkpoint",
        "gradient_checkpointing",
        "remat",
        "scan_layers",
        "attn_backend",
        "flash_attention_block_size",
    ]
)
# MoeConfig field -> config.json key, where Qwen3-MoE's HF config has the same field under another name.
_HF_NAMES = {
    "hidden_dim": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "intermediate_dim": "intermediate_size",
    "moe_intermediate_dim": "moe_intermediate_size",
    "shared_expert_intermediate_dim": "shared_expert_intermediate_size",
    "max_seq_len": "max_position_embeddings",
    "layer_norm_epsilon": "rms_norm_eps",
    "activation_function": "hidden_act",
    "use_bias": "attention_bias",
}
# safetensors dtype names numpy cannot spell by itself (safetensors.numpy cannot load bf16 without torch).
_DTYPES = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64}


class HfExportError(ValueError):
    """An export folder that cannot rebuild the model: says which folder and what is wrong."""


def export_model(
    model: MoeLMHeadModel, folder: str, tokenizer_path: str, max_shard_bytes: int = MAX_SHARD_BYTES
) -> dict[str, Any]:
    """Write `model` as an HF-style folder (module docstring) with the tokenizer at `tokenizer_path`; returns
    config.json's content. config.json goes first out and last in: a folder with one is complete.

    The tensors are copied to host memory a part (the embeddings, a layer...) at a time to size them, and
    kept while they fit in one file. A model that does not is copied again file by file, so the host holds
    one file and one part at most."""
    # In a multi-host run every process joins the gathers of sharded weights (`_on_host`); process 0 writes.
    writer = jax.process_index() == 0
    if writer:
        storage.delete(storage.join(folder, CONFIG_FILE))
    parts = _parts(settled(model))
    sizes: dict[str, int] = {}
    owner: dict[str, int] = {}
    kept: dict[str, np.ndarray] | None = {}  # every tensor, until they outgrow one file
    total = 0
    for index, part in enumerate(parts):
        for name, array in _on_host(part).items():
            sizes[name], owner[name] = array.nbytes, index
            total += array.nbytes
            if kept is not None:
                kept[name] = array
        if total > max_shard_bytes:
            kept = None
    shards = shard_plan(sizes, max_shard_bytes)
    names = [WEIGHTS_FILE] if len(shards) == 1 else [_shard_name(i, len(shards)) for i in range(len(shards))]
    for name, members in zip(names, shards, strict=True):
        held = kept
        if held is None:
            held = {}
            for index in sorted({owner[member] for member in members}):
                held |= _on_host(parts[index])
        if writer:
            payload = safetensors.numpy.save({member: held[member] for member in members}, metadata={"format": "pt"})
            storage.write_atomic(storage.join(folder, name), payload)
    hf_config = config_json(model.config, model.Vocab.size, model.embeddings.token_embeddings.weight.dtype)
    if not writer:
        return hf_config
    if len(shards) > 1:
        weight_map = {member: name for name, members in zip(names, shards, strict=True) for member in members}
        index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
        storage.write_json_atomic(storage.join(folder, INDEX_FILE), index_json)
    _remove_stale_weights(folder, keep=set(names) | ({INDEX_FILE} if len(shards) > 1 else set()))
    _copy_tokenizer(tokenizer_path, folder)
    storage.write_json_atomic(storage.join(folder, CONFIG_FILE), hf_config)
    logger.info("HF export: %d tensors, %.1f MB in %d file(s), under %s",
                len(sizes), total / 1e6, len(names), folder)  # fmt: skip
    return hf_config


def shard_plan(sizes: dict[str, int], max_shard_bytes: int) -> list[list[str]]:
    """Tensor names (in order) grouped into files as `transformers` groups them: a file closes when the
    next tensor would take it past `max_shard_bytes`; a tensor larger than that gets a file of its own."""
    if max_shard_bytes <= 0:
        raise ValueError(f"HF export: max_shard_bytes must be positive, got {max_shard_bytes}")
    shards: list[list[str]] = [[]]
    held = 0
    for name, size in sizes.items():
        if shards[-1] and held + size > max_shard_bytes:
            shards.append([])
            held = 0
        shards[-1].append(name)
        held += size
    return shards


def _shard_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def _remove_stale_weights(folder: str, keep: set[str]) -> None:
    """Weights files of an earlier export into `folder` that this one did not write (another sharding)."""
    for name in storage.list_names(folder):
        if (name.endswith(".safetensors") and name.startswith("model")) or name == INDEX_FILE:
            if name not in keep:
                storage.delete(storage.join(folder, name))


def export_checkpoint(
    checkpoints_path: str,
    model_config: MoeConfig,
    vocab_size: int,
    folder: str,
    trainer: TrainerConfig | None = None,
) -> str:
    """Export the latest complete checkpoint under `checkpoints_path` (or that `step-N/` itself), loaded as
    steps/evaluate/evaluate.py loads it, into `folder`; returns the checkpoint's path. `trainer` gives the device mesh
    (the run's own, so the vocabulary is padded as in training; default: this host's devices)."""
    checkpoint = latest_checkpoint(checkpoints_path, f"HF export to {folder}")
    if model_config.tokenizer is None:
        raise ValueError(f"HF export to {folder}: the model config names no tokenizer folder to copy")
    trainer = trainer or TrainerConfig(require_accelerator=False)
    with trainer.use_device_mesh(), hax.axis_mapping(trainer.compute_axis_mapping):
        vocab = round_axis_for_partitioning(Axis("vocab", vocab_size), trainer.parameter_axis_mapping)
        model = load_model(model_config, checkpoint, vocab, trainer)
    export_model(model, folder, model_config.tokenizer)
    return checkpoint


def load_hf_export(folder: str) -> MoeLMHeadModel:
    """The Levanter model an `export_model` folder holds, rebuilt from config.json and its weights files.

    Raises HfExportError naming the folder when a file is missing, config.json is not this model's or lacks a
    field, or a tensor is missing, unexpected, in another file than the index says, or of the wrong shape."""
    hf_config = storage.read_json(storage.join(folder, CONFIG_FILE))
    if hf_config is None:
        raise HfExportError(f"{folder}: no {CONFIG_FILE}; not an HF export, or an unfinished one (it is written last)")
    config = moe_config(hf_config, folder)
    tensors = read_weights(folder)
    template = config.build(Axis("vocab", _field(hf_config, "vocab_size", folder)), key=jax.random.PRNGKey(0))
    _check_tensors(tensors, model_tensors(template), folder)
    layers = [
        from_torch_compatible_state_dict(layer, tensors, prefix=f"model.layers.{index}")
        for index, layer in enumerate(template.transformer.layers_in_order())
    ]
    return _with_weights(template, layers, tensors)


def read_weights(folder: str) -> dict[str, np.ndarray]:
    """Every tensor of an export: from `model.safetensors`, or from the files its index maps them to."""
    index = storage.read_json(storage.join(folder, INDEX_FILE))
    if index is None:
        payload = storage.read_bytes(storage.join(folder, WEIGHTS_FILE))
        if payload is None:
            raise HfExportError(
                f"{folder}: no {WEIGHTS_FILE} (nor {INDEX_FILE}) beside its {CONFIG_FILE}; export the model again"
            )
        return _read_tensors(payload, folder, WEIGHTS_FILE)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise HfExportError(f"{folder}: {INDEX_FILE} has no weight_map; export the model again")
    tensors: dict[str, np.ndarray] = {}
    for name in sorted(set(weight_map.values())):
        payload = storage.read_bytes(storage.join(folder, name))
        if payload is None:
            raise HfExportError(f"{folder}: {INDEX_FILE} names {name}, which is missing; export the model again")
        found = _read_tensors(payload, folder, name)
        misplaced = sorted(tensor for tensor in found if weight_map.get(tensor) != name)
        if misplaced:
            raise HfExportError(
                f"{folder}: {name} holds {len(misplaced)} tensor(s) {INDEX_FILE} places elsewhere or not at all: "
                f"{misplaced[:3]}"
            )
        tensors |= found
    return tensors


def model_tensors(model: MoeLMHeadModel) -> dict[str, np.ndarray]:
    """Every weight and the router state under its export name (module docstring), as host arrays."""
    return {name: array for part in _parts(model) for name, array in _on_host(part).items()}


def _parts(model: MoeLMHeadModel) -> list[tuple[str | None, Any]]:
    """(name prefix, module) of the embeddings, the final norm, the LM head, then the layers in depth order."""
    parts: list[tuple[str | None, Any]] = [(None, model.embeddings), ("model.norm", model.transformer.norm)]
    if model.lm_head is not None:
        parts.append(("lm_head", model.lm_head))
    parts += [(f"model.layers.{index}", layer) for index, layer in enumerate(model.transformer.layers_in_order())]
    return parts


def _on_host(part: tuple[str | None, Any]) -> dict[str, np.ndarray]:
    prefix, module = part
    return {name: _to_numpy(array) for name, array in to_torch_compatible_state_dict(module, prefix=prefix).items()}


def _to_numpy(array: Any) -> np.ndarray:
    """The whole tensor on this host; an array sharded over several processes (a gang) is gathered from all."""
    if isinstance(array, jax.Array) and not array.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    return np.asarray(array)


def config_json(config: MoeConfig, vocab_size: int, dtype: Any) -> dict[str, Any]:
    """config.json's content for `config` with a `vocab_size` vocabulary and weights of `dtype`."""
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        if field.name in _RUN_TIME_FIELDS:
            continue
        value = getattr(config, field.name)
        if field.name == "rope":
            fields["rope_theta"], fields["rope_scaling"] = value.to_hf_config()
        elif field.name == "activation_function":
            fields[_HF_NAMES[field.name]] = value.value
        else:
            fields[_HF_NAMES.get(field.name, field.name)] = list(value) if isinstance(value, tuple) else value
    period = config.layers_per_period
    layer_types = [
        "full_attention" if (index + 1) % period == 0 or index == config.num_layers - 1 else "sliding_attention"
        for index in range(config.num_layers)
    ]
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": vocab_size,
        "torch_dtype": jnp.dtype(dtype).name,
        **fields,
        "layer_types": layer_types,
        "levanter_version": metadata.version("marin-levanter"),
        "haliax_version": metadata.version("marin-haliax"),
    }


def moe_config(hf_config: dict[str, Any], folder: str) -> MoeConfig:
    """The `MoeConfig` a config.json describes (run-time fields at their defaults, the tokenizer the folder's)."""
    if hf_config.get("model_type") != MODEL_TYPE:
        raise HfExportError(
            f"{folder}: {CONFIG_FILE} has model_type {hf_config.get('model_type')!r}, not {MODEL_TYPE!r}: "
            "not an export of steps/model/moe_model.py's model"
        )
    values: dict[str, Any] = {"tokenizer": folder, "reference_checkpoint": folder}
    for field in dataclasses.fields(MoeConfig):
        if field.name in _RUN_TIME_FIELDS:
            continue
        key = "rope_theta" if field.name == "rope" else _HF_NAMES.get(field.name, field.name)
        value = _field(hf_config, key, folder)
        if field.name == "rope":
            value = RotaryEmbeddingsConfig.from_hf_config(value, hf_config.get("rope_scaling"))
        elif field.name == "activation_function":
            value = ActivationFunctionEnum(value)
        elif isinstance(value, list):
            value = tuple(value)
        values[field.name] = value
    try:
        return MoeConfig(**values)
    except ValueError as error:
        raise HfExportError(f"{folder}: {CONFIG_FILE} describes no valid model: {error}") from error


def _field(hf_config: dict[str, Any], key: str, folder: str) -> Any:
    if key not in hf_config:
        raise HfExportError(f"{folder}: {CONFIG_FILE} lacks {key!r}; export the model again")
    return hf_config[key]


def _read_tensors(payload: bytes, folder: str, file: str) -> dict[str, np.ndarray]:
    tensors = {}
    for name, tensor in safetensors.deserialize(payload):
        if tensor["dtype"] not in _DTYPES:
            raise HfExportError(f"{folder}: tensor {name} in {file} has dtype {tensor['dtype']}; expected a float type")
        array = np.frombuffer(tensor["data"], dtype=_DTYPES[tensor["dtype"]])
        tensors[name] = array.reshape(tensor["shape"])
    return tensors


def _check_tensors(found: dict[str, np.ndarray], expected: dict[str, np.ndarray], folder: str) -> None:
    """Every tensor the config's model holds, of its shape, and nothing else."""
    missing = sorted(expected.keys() - found.keys())
    unexpected = sorted(found.keys() - expected.keys())
    if missing or unexpected:
        raise HfExportError(
            f"{folder}: the weights do not match {CONFIG_FILE}: {len(missing)} tensors missing "
            f"{missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}"
        )
    for name, array in expected.items():
        if found[name].shape != array.shape:
            raise HfExportError(
                f"{folder}: tensor {name} has shape {found[name].shape}, but {CONFIG_FILE} needs {array.shape}"
            )


def _with_weights(template: MoeLMHeadModel, layers: list[Any], tensors: dict[str, np.ndarray]) -> MoeLMHeadModel:
    """`template` holding the loaded layers (restacked into its periods and tail) and top-level weights."""
    transformer: MoeTransformer = template.transformer
    period = template.config.layers_per_period
    periods = transformer.periods
    if periods is not None:
        blocks = periods.unstacked()  # the template's periods (the loader builds scanned stacks)
        periods = _stack_like(periods, [_period_like(block, layers[n * period :]) for n, block in enumerate(blocks)])
        layers = layers[len(blocks) * period :]
    tail = None if transformer.tail is None else _period_like(transformer.tail, layers)
    norm = from_torch_compatible_state_dict(transformer.norm, tensors, prefix="model.norm")
    model = eqx.tree_at(
        lambda m: (m.transformer.periods, m.transformer.tail, m.transformer.norm),
        template,
        (periods, tail, norm),
        is_leaf=lambda node: node is None,
    )
    model = eqx.tree_at(lambda m: m.embeddings, model, from_torch_compatible_state_dict(model.embeddings, tensors))
    if model.lm_head is not None:
        model = eqx.tree_at(
            lambda m: m.lm_head, model, from_torch_compatible_state_dict(model.lm_head, tensors, prefix="lm_head")
        )
    return model


def _period_like(template: MoePeriod, layers: Sequence[Any]) -> MoePeriod:
    """`template` (a period of n layers) holding the first n of `layers`."""
    size = 1 if template.local is None else template.local.Block.size + 1
    local = None if template.local is None else _stack_like(template.local, layers[: size - 1])
    return MoePeriod(local, layers[size - 1])


def _stack_like(template: Stacked, blocks: Sequence[Any]) -> Any:
    """`template` (a stack of len(blocks) modules) holding `blocks`: arrays stacked on the leading axis, other
    leaves (flags) kept as the template has them."""
    template_leaves, structure = jax.tree.flatten(template)
    columns = zip(*(jax.tree.leaves(block) for block in blocks), strict=True)
    leaves = [
        jnp.stack(column) if isinstance(leaf, jax.Array) else leaf
        for leaf, column in zip(template_leaves, columns, strict=True)
    ]
    return jax.tree.unflatten(structure, leaves)


def _copy_tokenizer(tokenizer_path: str, folder: str) -> None:
    for name in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE):
        data = storage.read_bytes(storage.join(tokenizer_path, name))
        if data is None and name == TOKENIZER_FILE:
            raise FileNotFoundError(f"HF export to {folder}: no {TOKENIZER_FILE} under {tokenizer_path}")
        if data is not None:
            storage.write_atomic(storage.join(folder, name), data)
