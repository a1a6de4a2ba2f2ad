"""The MoE network's hyperparameters: what the block (moe_block), the layers (moe_layers) and the model
(moe_model) read, kept below all three so that none of them imports another's config.

`MoeArchitecture` holds every option the module docstring of `moe_model` describes, with the checks that
make a bad combination fail when the config is built (not deep inside a traced function), and the
model's size in the one calculator's terms (`moe_shape`, `flops_per_token`, `total_trainable_params`).
`moe_model.MoeConfig` is this plus the model class Levanter builds from it (`model_type`), registered
with Levanter's config registry as `moe_balanced`.
"""

from __future__ import annotations

from dataclasses import dataclass

from haliax import Axis
from levanter.models.qwen3_moe import Qwen3MoeConfig

from steps.model import model_size
from steps.model.model_size import MoeShape

ROUTER_COMBINES = ("softmax", "sigmoid")
"""The gate functions `MoeArchitecture.router_combine` may name."""
REMAT_POLICIES = ("none", "layer", "period")
"""What the backward pass recomputes (`MoeArchitecture.remat`; steps/model/moe_layers.py): nothing, each layer from
its input, or each local/global period from its input."""


@dataclass(frozen=True)
class MoeArchitecture(Qwen3MoeConfig):
    """Levanter's Qwen3-MoE config with local/global attention layers, latent experts, router-bias
    balancing, shared experts and router z-loss: every hyperparameter and its checks, without the model
    class (`moe_model.MoeConfig` adds it), so the block and layer modules can read it from below."""

    router_bias_balancing: bool = False
    """Update each layer's router bias by the aux-loss-free rule every step (steps/model/moe_model.py's docstring)."""
    router_z_loss_weight: float = 0.0
    """Weight of the router z-loss (mean over tokens of logsumexp(router logits)^2, summed over layers)."""
    num_shared_experts: int = 0
    """Shared SwiGLU experts every token passes through."""
    shared_expert_intermediate_dim: int = 0
    """Hidden width of one shared expert."""
    expert_latent_dim: int | None = None
    """Routed experts work inside a latent of this width (None: on d_model)."""
    global_every: int = 1
    """With a `sliding_window`, every n-th layer (1-based) and the last are global; the others are local."""
    num_kv_heads_local: int | None = None
    """KV heads of local layers (None: `num_kv_heads`, the global layers' count)."""
    use_qk_norm: bool = False
    """RMS-normalise queries and keys per head (Qwen3's default is on; see the module docstring)."""
    capacity_factor: float | None = None
    """Each routed expert takes at most ceil(factor x seq_len x top_k / experts) tokens of each sequence, the rest
    are dropped (their routed output is zero); None: dropless (steps/model/moe_block.py). In training and in
    evaluation (`inference_mode`) alike: the evaluate step scores with it and, with the same weights, without."""
    router_combine: str = "softmax"
    """How the chosen experts' outputs are weighted: "softmax" (Qwen3's: the softmax over all experts' logits,
    read at the chosen ones) or "sigmoid" (the hero's: each chosen expert's sigmoid(logit) on its own). With
    `norm_topk_prob` the chosen weights are then rescaled to sum to `router_combine_sum`."""
    router_combine_sum: float = 1.0
    """What each token's chosen weights sum to after renormalisation (the hero: 2.5 with "sigmoid")."""
    remat: str = "none"
    """Rematerialisation (`REMAT_POLICIES`): "none" keeps every layer's intermediates for the backward pass;
    "layer" keeps each layer's input and recomputes its intermediates; "period" keeps each local/global period's
    input and recomputes its layers. It changes memory and time, never the numbers computed; the memory plan
    (steps/train/parallelism.py) chooses it. Levanter's inherited `gradient_checkpointing` is not read."""

    def __post_init__(self) -> None:
        self._check_attention()  # before Levanter's, which asserts
        super().__post_init__()
        if self.router_bias_balancing and self.num_experts_per_tok >= self.num_experts:
            raise ValueError(
                f"router-bias balancing needs top_k < n_experts (got top_k={self.num_experts_per_tok}, "
                f"n_experts={self.num_experts}): with every expert chosen there is no threshold to balance"
            )
        if self.router_z_loss_weight < 0:
            raise ValueError(f"router_z_loss_weight must be >= 0, got {self.router_z_loss_weight}")
        if self.num_shared_experts < 0 or (self.num_shared_experts > 0) != (self.shared_expert_intermediate_dim > 0):
            raise ValueError(
                f"shared experts need num_shared_experts >= 0 and a positive width exactly when there are any "
                f"(got {self.num_shared_experts} of width {self.shared_expert_intermediate_dim})"
            )
        if self.dense_router_gradient:
            raise ValueError("dense_router_gradient is not supported by MoeConfig's routing; leave it off")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ValueError(f"capacity_factor must be positive or None, got {self.capacity_factor}")
        if self.expert_latent_dim is not None and self.expert_latent_dim <= 0:
            raise ValueError(f"expert_latent_dim must be positive or None, got {self.expert_latent_dim}")
        self._check_combine()
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")

    def _check_combine(self) -> None:
        if self.router_combine not in ROUTER_COMBINES:
            raise ValueError(f"router_combine must be one of {ROUTER_COMBINES}, got {self.router_combine!r}")
        if not self.router_combine_sum > 0:
            raise ValueError(f"router_combine_sum must be positive, got {self.router_combine_sum}")
        if self.router_combine_sum != 1.0 and not self.norm_topk_prob:
            raise ValueError(
                f"router_combine_sum={self.router_combine_sum} rescales renormalised weights: set norm_topk_prob"
            )

    def _check_attention(self) -> None:
        if self.global_every < 1:
            raise ValueError(f"global_every must be >= 1, got {self.global_every}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be positive or None, got {self.sliding_window}")
        kv_widths = {"num_kv_heads": self.num_kv_heads}
        if self.layers_per_period > 1 and self.num_layers > 1:  # there are local layers
            kv_widths["num_kv_heads_local"] = self.local_kv_heads
        for name, kv_heads in kv_widths.items():
            if kv_heads < 1 or self.num_heads % kv_heads:
                raise ValueError(f"num_heads={self.num_heads} is not a positive multiple of {name}={kv_heads}")

    @property
    def shared_mlp_axis(self) -> Axis:
        return Axis(name="shared_mlp", size=self.num_shared_experts * self.shared_expert_intermediate_dim)

    @property
    def Latent(self) -> Axis:  # noqa: N802 (Levanter names axes in capitals: Embed, Experts)
        assert self.expert_latent_dim is not None, "Latent exists only with expert_latent_dim"
        return Axis(name="latent", size=self.expert_latent_dim)

    @property
    def ExpertIn(self) -> Axis:  # noqa: N802
        """What routed experts read and write: the latent, or d_model under a name of its own (`expert_embed`).

        The mesh splits `embed` over every device and `experts` over `expert` (steps/model/levanter_config.py),
        and one array cannot split two of its axes over the same mesh axis: an expert weight holding both
        could not be laid out. Renamed, its d_model axis is left whole and the block renames the tokens'."""
        if self.expert_latent_dim is None:
            return Axis(name="expert_embed", size=self.hidden_dim)
        return self.Latent

    @property
    def RouterExperts(self) -> Axis:  # noqa: N802
        """The router gate's output: the experts under a name of their own, so that the gate (d_model x
        experts) splits on d_model over every device, as `ExpertIn` says; its logits are renamed `Experts`."""
        return Axis(name="router_experts", size=self.num_experts)

    @property
    def local_kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads_local is None else self.num_kv_heads_local

    @property
    def layers_per_period(self) -> int:
        """The local/global pattern's period (steps/model/moe_layers.py): 1 when every layer is global."""
        return 1 if self.sliding_window is None else self.global_every

    def moe_shape(self, vocab_size: int, seq_len: int | None = None) -> MoeShape:
        """This model as the calculator's `MoeShape` (sequence `seq_len`, default `max_seq_len`)."""
        return MoeShape(
            d_model=self.hidden_dim,
            n_layers=self.num_layers,
            vocab_size=vocab_size,
            n_heads=self.num_heads,
            head_dim=self.actual_head_size,
            kv_heads_local=self.local_kv_heads,
            kv_heads_global=self.num_kv_heads,
            global_every=self.global_every,
            sliding_window=self.sliding_window,
            n_experts=self.num_experts,
            top_k=self.num_experts_per_tok,
            expert_width=self.moe_intermediate_dim,
            latent_dim=self.expert_latent_dim,
            n_shared_experts=self.num_shared_experts,
            shared_width=self.shared_expert_intermediate_dim,
            seq_len=self.max_seq_len if seq_len is None else seq_len,
            tied_embeddings=self.tie_word_embeddings,
        )

    def flops_per_token(self, vocab_size: int, context_length: int) -> float | None:
        # Levanter wants forward FLOPs (it multiplies by 3 for training); the calculator gives training FLOPs.
        return model_size.flops_per_token(self.moe_shape(vocab_size, context_length)) / 3

    def total_trainable_params(self, vocab_size: int) -> int:
        qk_norms = 2 * self.actual_head_size * self.num_layers if self.use_qk_norm else 0
        return model_size.total_params(self.moe_shape(vocab_size)) + qk_norms
