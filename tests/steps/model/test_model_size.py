"""The model-size and FLOPs calculator: hand counts on a small model, and the hero run's published table."""

import pytest

from steps.model.model_size import MoeShape, active_params, flops_per_token, ladder_shape, total_params, training_flops


def small_shape(**changes: object) -> MoeShape:
    settings: dict = dict(
        d_model=8,
        n_layers=2,
        vocab_size=10,
        n_heads=2,
        head_dim=4,
        kv_heads_local=1,
        kv_heads_global=2,
        global_every=2,
        sliding_window=3,
        n_experts=4,
        top_k=2,
        expert_width=6,
        latent_dim=4,
        n_shared_experts=1,
        shared_width=5,
        seq_len=5,
    )
    settings.update(changes)
    return MoeShape(**settings)


def test_small_model_counts_by_hand() -> None:
    shape = small_shape()
    # Layer 0 is local (1 KV head): q,o 2*8*8 + k,v 2*8*1*4 = 192. Layer 1 is the last, so global: 128 + 2*8*2*4 = 256.
    # Per layer: latent 2*8*4 + shared 3*8*5 + router 8*4 + norms 2*8 = 232; a routed expert is 3*4*6 = 72.
    assert active_params(shape) == 192 + 256 + 2 * (232 + 2 * 72) + 8
    assert total_params(shape) == 1208 + 2 * 2 * 72 + 2 * 10 * 8
    # 6 * active + head 6*8*10 + attention 12*ctx*heads*head_dim with ctx 3 (window) and 5 (global).
    assert flops_per_token(shape) == 6 * 1208 + 480 + 12 * 3 * 8 + 12 * 5 * 8
    assert training_flops(shape, 1000) == 1000 * flops_per_token(shape)


def test_variants_change_counts_as_expected() -> None:
    assert total_params(small_shape(tied_embeddings=True)) == total_params(small_shape()) - 10 * 8
    # Without a latent, experts read d_model directly: 3*8*6 each, and no projections.
    no_latent = small_shape(latent_dim=None)
    assert active_params(no_latent) == active_params(small_shape()) - 2 * (2 * 8 * 4) + 2 * 2 * (3 * 8 * 6 - 72)
    # No sliding window: every layer global, with full context.
    all_global = small_shape(sliding_window=None)
    assert active_params(all_global) == active_params(small_shape()) + 2 * 8 * 1 * 4
    assert flops_per_token(all_global) > flops_per_token(small_shape())


@pytest.mark.parametrize("changes", [{"top_k": 5}, {"n_layers": 0}, {"vocab_size": -1}])
def test_bad_shapes_are_refused(changes: dict) -> None:
    with pytest.raises(ValueError):
        small_shape(**changes)


# The published ladder and hero: d_model, layers, batch, steps, tokens, active, total, FLOPs.
PUBLISHED = [
    (768, 8, 1024, 11_420, 48e9, 60.6e6, 1.588e9, 5.5e19),
    (1024, 12, 2048, 15_276, 128e9, 162.0e6, 3.973e9, 2.7e20),
    (1536, 16, 6144, 15_128, 381e9, 481.3e6, 11.52e9, 1.8e21),
    (2048, 22, 11264, 20_072, 926e9, 1.171e9, 27.72e9, 9.2e21),
    (6144, 48, 11264, 390_251, 18e12, 22.76e9, 535.3e9, 2.7e24),
]


@pytest.mark.parametrize(("d_model", "layers", "batch", "steps", "tokens", "active", "total", "flops"), PUBLISHED)
def test_ladder_matches_the_published_table(
    d_model: int, layers: int, batch: int, steps: int, tokens: float, active: float, total: float, flops: float
) -> None:
    shape = ladder_shape(d_model, layers)
    trained_tokens = batch * shape.seq_len * steps
    assert trained_tokens == pytest.approx(tokens, rel=0.02)
    # The published active counts give global layers the local layers' KV width: 0.7% more at most.
    assert active_params(shape) == pytest.approx(active, rel=0.01)
    assert total_params(shape) == pytest.approx(total, rel=0.01)
    assert training_flops(shape, trained_tokens) == pytest.approx(flops, rel=0.05)
