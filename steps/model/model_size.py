"""Parameter and FLOP counts for the mixture-of-experts language models we train.

One calculator serves the train step (MFU), the scaling ladder (compute per rung) and the hero plan
(tokens, FLOPs, accelerator-hours), so the three can never disagree about how big a model is.

Counting conventions, chosen to match how the Marin 535B-A23B run published its figures:

- **total** parameters: every weight, embeddings and (untied) output head included.
- **active** parameters: the non-embedding weights one token touches: attention, router, the
  latent projections, its top-k routed experts, the shared experts and the norms. Neither the
  input embedding nor the output head counts.
- **training FLOPs** per token: 6 x active (forward and backward of every matmul a token passes
  through), plus 6 x d_model x vocab for the output head, plus attention's score and value products,
  12 x context x heads x head_dim per layer, where context is the full sequence on global layers and
  the sliding window on local ones (PaLM's convention: no halving for causal masking).

A worked example, the hero's first rung (d_model 768, 8 layers; `ladder_shape(768, 8)`): each layer
holds 384 experts of 3 x 384 x 384 weights (SwiGLU inside a 384-wide latent), two shared SwiGLU
experts of 3 x 768 x 384, attention 2 x 768 x 768 plus one KV head pair, a 768 x 384 router and a
768 -> 384 -> 768 latent projection: 1.588B parameters in all, 60.6M of them active.

It also holds a model's layout on a mesh in numbers, without JAX, for the plans (steps/model/levanter_config.py
and expert_parallel.py build the arrays): the devices a batch and a weight's FSDP shard split over
(`data_parallel_size`), the dimensions a mesh would split unevenly (`uneven_splits`), and the slot grid of a
dropless layer's rounds (`DROPLESS_ROUND_FACTOR`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class MoeShape:
    """The shape of a decoder-only MoE transformer: what the counts below depend on."""

    d_model: int
    """Width of the residual stream."""
    n_layers: int
    """Transformer blocks; every block has attention and an MoE feed-forward."""
    vocab_size: int
    """Tokenizer vocabulary size (rows of the embedding and of the output head)."""
    n_heads: int
    """Query heads."""
    head_dim: int
    """Width of one attention head."""
    kv_heads_local: int
    """Key/value heads on sliding-window (local) layers."""
    kv_heads_global: int
    """Key/value heads on full-attention (global) layers."""
    global_every: int
    """Every n-th layer (1-based) is global, and so is the last; 1 makes every layer global."""
    sliding_window: int | None
    """Attention window of local layers; None makes every layer global."""
    n_experts: int
    """Routed experts per layer."""
    top_k: int
    """Routed experts each token is sent to."""
    expert_width: int
    """Hidden width of one routed expert's SwiGLU."""
    latent_dim: int | None
    """Routed experts work inside a latent of this width (projections d_model -> latent -> d_model
    shared by all experts of a layer); None: experts read and write d_model directly."""
    n_shared_experts: int
    """Shared experts every token passes through."""
    shared_width: int
    """Hidden width of one shared expert's SwiGLU (on d_model)."""
    seq_len: int
    """Training sequence length."""
    tied_embeddings: bool = False
    """Whether the output head reuses the input embedding."""

    def __post_init__(self) -> None:
        if self.top_k > self.n_experts:
            raise ValueError(
                f"top_k={self.top_k} exceeds n_experts={self.n_experts}: a token cannot visit more experts than exist"
            )
        positive = ("d_model", "n_layers", "vocab_size", "n_heads", "head_dim", "kv_heads_local", "kv_heads_global")
        for name in (*positive, "global_every", "n_experts", "top_k", "expert_width", "seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("sliding_window", "latent_dim"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive or None, got {getattr(self, name)}")

    def is_global(self, layer: int) -> bool:
        """Whether `layer` (0-based) attends over the whole sequence."""
        if self.sliding_window is None:
            return True
        return (layer + 1) % self.global_every == 0 or layer == self.n_layers - 1

    def attention_context(self, layer: int) -> int:
        """How many positions a query of `layer` attends to, at most."""
        if self.is_global(layer) or self.sliding_window is None:
            return self.seq_len
        return min(self.sliding_window, self.seq_len)


def _attention_params(shape: MoeShape, layer: int) -> int:
    kv_heads = shape.kv_heads_global if shape.is_global(layer) else shape.kv_heads_local
    query_and_output = 2 * shape.d_model * shape.n_heads * shape.head_dim
    keys_and_values = 2 * shape.d_model * kv_heads * shape.head_dim
    return query_and_output + keys_and_values


def _routed_expert_params(shape: MoeShape) -> int:
    expert_input = shape.latent_dim or shape.d_model
    return 3 * expert_input * shape.expert_width


def _dense_params_per_layer(shape: MoeShape) -> int:
    """Weights of one layer, apart from attention, that every token passes through."""
    latent = 2 * shape.d_model * shape.latent_dim if shape.latent_dim else 0
    shared = shape.n_shared_experts * 3 * shape.d_model * shape.shared_width
    router = shape.d_model * shape.n_experts
    norms = 2 * shape.d_model
    return latent + shared + router + norms


def embedding_params(shape: MoeShape) -> int:
    """Input embedding plus the output head (once when tied)."""
    tables = 1 if shape.tied_embeddings else 2
    return tables * shape.vocab_size * shape.d_model


def active_params(shape: MoeShape) -> int:
    """Non-embedding parameters one token touches."""
    per_layer = sum(_attention_params(shape, layer) for layer in range(shape.n_layers))
    per_layer += shape.n_layers * (_dense_params_per_layer(shape) + shape.top_k * _routed_expert_params(shape))
    final_norm = shape.d_model
    return per_layer + final_norm


def total_params(shape: MoeShape) -> int:
    """Every parameter of the model."""
    idle_experts = shape.n_layers * (shape.n_experts - shape.top_k) * _routed_expert_params(shape)
    return active_params(shape) + idle_experts + embedding_params(shape)


def flops_per_token(shape: MoeShape) -> float:
    """Training (forward + backward) FLOPs for one token; see the module docstring."""
    matmuls = 6 * active_params(shape)
    output_head = 6 * shape.d_model * shape.vocab_size
    attention = sum(
        12 * shape.attention_context(layer) * shape.n_heads * shape.head_dim for layer in range(shape.n_layers)
    )
    return float(matmuls + output_head + attention)


def training_flops(shape: MoeShape, tokens: float) -> float:
    """Training FLOPs for `tokens` tokens."""
    return flops_per_token(shape) * tokens


def ladder_shape(d_model: int, n_layers: int, *, vocab_size: int = 128_256, seq_len: int = 4096) -> MoeShape:
    """The hero run's recipe at width `d_model`: what every rung of its ladder and the hero share.

    Heads of width 128; KV heads d/512 on local layers (window 2048) and d/1024 (at least one) on global
    ones (every 4th and the last); 384 routed experts, top-8, each a SwiGLU of width d/2 inside a d/2
    latent; two shared SwiGLU experts of width d/2; untied embeddings.
    """
    head_dim = 128
    if d_model % head_dim:
        raise ValueError(f"d_model={d_model} must be a multiple of the head width {head_dim}")
    half = d_model // 2
    return MoeShape(
        d_model=d_model,
        n_layers=n_layers,
        vocab_size=vocab_size,
        n_heads=d_model // head_dim,
        head_dim=head_dim,
        kv_heads_local=max(1, d_model // 512),
        kv_heads_global=max(1, d_model // 1024),
        global_every=4,
        sliding_window=2048,
        n_experts=384,
        top_k=8,
        expert_width=half,
        latent_dim=half,
        n_shared_experts=2,
        shared_width=half,
        seq_len=seq_len,
    )


# --- the layout on a mesh (module docstring) ---


DROPLESS_ROUND_FACTOR = 1.25
"""The slot grid of a dropless layer's rounds, as a capacity factor: a balanced router's fullest cell rarely
passes 1.25 x a fair share, so one round mostly serves every copy; a skewed router takes more rounds, never
a bigger buffer."""


def data_parallel_size(mesh: Mapping[str, int]) -> int:
    """Devices a weight's FSDP shard and the batch split over besides `expert`: `domain` x `data`."""
    return mesh.get("domain", 1) * mesh.get("data", 1)


def uneven_splits(shape: MoeShape, mesh: Mapping[str, int]) -> list[str]:
    """The dimensions `trainer_mesh`'s layout would split unevenly over `mesh` (JAX refuses those), as
    "name (size by parts)"; empty when the mesh can be built for `shape`."""
    data, expert = data_parallel_size(mesh), mesh.get("expert", 1)
    split = {
        "d_model over data x expert": (shape.d_model, data * expert),
        "experts over expert": (shape.n_experts, expert),
        "expert_width over data": (shape.expert_width, data),
    }
    return [f"{name} ({size} by {parts})" for name, (size, parts) in split.items() if size % parts]
