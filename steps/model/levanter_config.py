"""Our shapes and caches, as Levanter's config objects.

The train and evaluate steps describe a model by `MoeShape` (steps/model/model_size.py, the one parameter and
FLOPs calculator) and data by the tokenize step's output folders; Levanter wants a `Qwen3MoeConfig` and an
`LmDataConfig`. These two translations live here, once, so that the model trained and the model evaluated
can never differ.

The model is steps/model/moe_model.py's `MoeConfig`: Levanter's `qwen3_moe` (routed SwiGLU experts, top-k routing
with renormalised weights, the HF load-balancing auxiliary loss) plus local sliding-window and global attention
layers with their own KV widths, latent experts, shared experts, a router z-loss and the aux-loss-free
router-bias balancing. Every run gets that model, whatever its options, so that a checkpoint always has the
same tree (the bias and expert loads are carried even when balancing is off) and evaluation routes exactly as
training did. It holds exactly the weights steps/model/model_size.py counts for the shape.

Layout: `trainer_mesh` turns a plan's mesh (`{"data": D, "expert": E}`, or `{"domain": R, "data": D, "expert": E}`
on R fast domains, steps/train/parallelism.py) into Levanter's `MeshConfig`. Every device holds its own sequences
and a 1/(R x D x E) share of every weight, its gradient and its AdamW moments (`data` below is `domain x data`
where the mesh has domains: `domain` is the outermost axis, `expert` the innermost, inside one domain):

    what                                        its axis   split over
    the batch (compute)                         batch      data x expert
    dense weights: attention, embeddings,       embed      data x expert
      LM head, norms, router, shared experts,
      latent projections
    routed experts                              experts    expert (E groups of n_experts / E)
                                                mlp        data (FSDP within a group)
    router bias and loads (carried, untrained)  experts    expert

Dense weights are FSDP: the compute mapping leaves `embed` whole, so each is gathered where it is used. JAX
cannot split two axes of one array over the same mesh axis, and haliax maps axes by name, so no array may
hold both `embed` and `experts`: the router's output is `router_experts`, and routed experts without a latent
read d_model as `expert_embed` (steps/model/config.py). Each split must be even (`uneven_splits`): d_model by
D x E, n_experts by E, the experts' width by D. Without a mesh, Levanter's default (all devices on `data`,
`embed` over them) is kept, so the tiny runs are laid out as before.

Data: each component is a tokenize step's output (`train/` and `validation/` Levanter caches); Levanter
opens `<cache_dir>/<split>` itself and, with `auto_build_caches=False`, never tokenizes at run time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from levanter.data.text.datasets import DatasetComponent, LmDataConfig
from levanter.utils.mesh import MeshConfig

from steps.model.model_size import MoeShape, uneven_splits
from steps.model.moe_model import MoeConfig


def qwen3_moe_config(
    shape: MoeShape,
    *,
    tokenizer_path: str,
    router_aux_loss_coef: float | None,
    step: str,
    router_bias_balancing: bool = False,
    router_z_loss_weight: float = 0.0,
    capacity_factor: float | None = None,
    router_combine: str = "softmax",
    router_combine_sum: float = 1.0,
    remat: str = "none",
) -> MoeConfig:
    """The MoE model config for `shape` (Levanter's Qwen3-MoE, extended by steps/model/moe_model.py); an impossible
    shape or options raise ValueError naming `step`. `capacity_factor`, `router_combine`, `router_combine_sum`
    and `remat`: see `MoeArchitecture` (steps/model/config.py).

    The tokenizer folder doubles as the HF reference checkpoint: Levanter builds an HF converter for every
    HF-compatible model and would otherwise fetch the Qwen3 reference's tokenizer from the hub."""
    try:
        config = _moe_config(shape, tokenizer_path, router_aux_loss_coef, router_bias_balancing, router_z_loss_weight)
        return dataclasses.replace(
            config,
            capacity_factor=capacity_factor,
            router_combine=router_combine,
            router_combine_sum=router_combine_sum,
            remat=remat,
        )
    except ValueError as error:
        raise ValueError(f"{step}: {error}") from error


def _moe_config(
    shape: MoeShape,
    tokenizer_path: str,
    router_aux_loss_coef: float | None,
    router_bias_balancing: bool,
    router_z_loss_weight: float,
) -> MoeConfig:
    return MoeConfig(
        max_seq_len=shape.seq_len,
        hidden_dim=shape.d_model,
        intermediate_dim=shape.expert_width,
        moe_intermediate_dim=shape.expert_width,
        num_layers=shape.n_layers,
        num_heads=shape.n_heads,
        head_dim=shape.head_dim,
        num_kv_heads=shape.kv_heads_global,
        num_kv_heads_local=shape.kv_heads_local,
        sliding_window=shape.sliding_window,
        global_every=shape.global_every,
        expert_latent_dim=shape.latent_dim,
        tie_word_embeddings=shape.tied_embeddings,
        num_experts=shape.n_experts,
        num_experts_per_tok=shape.top_k,
        router_aux_loss_coef=router_aux_loss_coef,
        router_bias_balancing=router_bias_balancing,
        router_z_loss_weight=router_z_loss_weight,
        num_shared_experts=shape.n_shared_experts,
        shared_expert_intermediate_dim=shape.shared_width if shape.n_shared_experts else 0,
        tokenizer=tokenizer_path,
        reference_checkpoint=tokenizer_path,
        gradient_checkpointing=False,  # not read: `remat` says what is recomputed
    )


MESH_AXES = ("domain", "data", "expert")
"""The mesh axes a plan may name: fast domains (racks, the outermost axis: data parallel across them), data
parallelism (FSDP) within a domain, and expert parallelism (inside one domain)."""


@dataclasses.dataclass(frozen=True)
class RackMeshConfig(MeshConfig):
    """Levanter's mesh with `domain` its outermost axis, so that each domain is a block of consecutive devices
    (jax.devices() lists a rack's devices together, host by host) and the `expert` axis, innermost, stays inside
    one. Levanter orders its own axes (`data` first) before the ones a config adds."""

    def axis_shapes(self, num_devices: int, num_slices: int) -> tuple[dict[str, int], dict[str, int]]:
        ici, dcn = super().axis_shapes(num_devices, num_slices)
        return {"domain": ici.pop("domain"), **ici}, dcn


def trainer_mesh(mesh: Mapping[str, int] | None, shape: MoeShape, devices: int) -> MeshConfig:
    """Levanter's mesh for a plan's `mesh` over `devices` (module docstring; None: Levanter's default). A mesh
    that names another axis, does not multiply to `devices` or splits an axis unevenly raises ValueError."""
    if mesh is None:
        return MeshConfig()
    unknown = sorted(set(mesh) - set(MESH_AXES))
    if unknown or any(not isinstance(size, int) or size < 1 for size in mesh.values()):
        raise ValueError(f"mesh {dict(mesh)} must map axes among {MESH_AXES} to positive sizes")
    domain, data, expert = mesh.get("domain", 1), mesh.get("data", 1), mesh.get("expert", 1)
    if domain * data * expert != devices:
        raise ValueError(f"mesh {dict(mesh)} holds {domain * data * expert} devices but the run has {devices}")
    uneven = uneven_splits(shape, mesh)
    if uneven:
        raise ValueError(f"mesh {dict(mesh)} splits {', '.join(uneven)} unevenly; choose sizes that divide them")
    if "domain" not in mesh:  # one fast domain: the mesh as it always was
        return MeshConfig(
            axes={"data": data, "expert": expert},
            compute_mapping={"batch": ("data", "expert")},
            shared_mapping={"experts": "expert"},
            param_mapping={"embed": ("data", "expert"), "mlp": "data"},
        )
    # The same layout with data parallelism split in two: across domains, then within one.
    return RackMeshConfig(
        axes={"domain": domain, "data": data, "expert": expert},
        compute_mapping={"batch": ("domain", "data", "expert")},
        shared_mapping={"experts": "expert"},
        param_mapping={"embed": ("domain", "data", "expert"), "mlp": ("domain", "data")},
    )


def lm_data_config(
    tokenizer_path: str,
    components: Mapping[str, str],
    schedule: Sequence[tuple[int, Mapping[str, float]]] | None = None,
    mixture_block_size: int = 2048,
    train_only: Collection[str] = (),
) -> LmDataConfig:
    """A Levanter data config over tokenize-step outputs `components` (name -> folder holding `train/` and
    `validation/`), mixed by `schedule` = [(start_step, weights), ...] (default: equal weights throughout).
    Components named in `train_only` are trained on and have no validation set (Levanter's flat cache)."""
    if schedule is None:
        schedule = [(0, dict.fromkeys(components, 1.0))]
    weights = [(start, dict(phase)) for start, phase in schedule]
    return LmDataConfig(
        tokenizer=tokenizer_path,
        cache_dir=None,
        auto_build_caches=False,
        components={
            name: DatasetComponent(cache_dir=f"{path}/train", flat_cache=True) if name in train_only
            else DatasetComponent(cache_dir=path)
            for name, path in components.items()
        },
        train_weights=weights[0][1] if len(weights) == 1 else weights,
        mixture_block_size=mixture_block_size,
    )
