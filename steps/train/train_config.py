"""The train step's config, apart from the step (steps/train/train.py): `TrainConfig`, which optimizer
(`OPTIMIZERS`), the hero optimizer's rates and betas (`HeroHyperparameters`) and the heuristic that derives them
from a run's compute (`MoeHeuristic`). Plain data and arithmetic: a DAG's definition builds them and the planner
checks them (`TrainConfig.check_settings`) without loading JAX or Levanter; steps/train/optimizer.py builds the
optimizers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from steps.model.model_size import MoeShape

OPTIMIZERS = ("adamw", "hero")
"""`TrainConfig.optimizer`'s choices."""


@dataclass(frozen=True)
class HeroHyperparameters:
    """The `hero` optimizer's settings (`MoeHeuristic` derives them from a run's compute). Versioned."""

    adam_lr: float
    """Peak learning rate of the Adam group."""
    muonh_lr: float
    """Peak step of the MuonH group, as a share of each matrix's norm."""
    adamh_lr: float
    """Peak step of the AdamH readout, as a share of its norm."""
    beta1: float = 0.9062
    """Adam's and AdamH's first-moment decay."""
    beta2: float = 0.95
    """Adam's and AdamH's second-moment decay."""
    epsilon: float = 1e-8
    """Adam's and AdamH's denominator epsilon."""
    momentum: float = 0.95
    """MuonH's (Nesterov) momentum."""
    newton_schulz_steps: int = 5
    """Newton-Schulz steps of each MuonH update."""
    newton_schulz_coefficients: str = "quintic"
    """Which of Levanter's `NEWTON_SCHULZ_COEFFICIENTS` schedules the steps take their (a, b, c) from, step i
    the i-th triple (cyclically): "quintic" (the hero's, Levanter's default: five triples), "simple" (one
    triple, Muon's), "polar_express" or "aol"."""
    newton_schulz_epsilon: float = 1e-8
    """Added to the Frobenius norm each matrix is divided by before the iteration (Levanter's `muon_epsilon`)."""
    max_grad_norm: float | None = None
    """Global gradient-norm clip before every group (None, the published hero's: none)."""

    def __post_init__(self) -> None:
        if self.newton_schulz_coefficients not in NEWTON_SCHULZ_SCHEDULES:
            raise ValueError(
                f"newton_schulz_coefficients={self.newton_schulz_coefficients!r} is none of Levanter's "
                f"{sorted(NEWTON_SCHULZ_SCHEDULES)}"
            )


@dataclass(frozen=True)
class MoeHeuristic:
    """Optimizer hyperparameters from a run's compute: the hero's heuristic (marin issue #8435), its constants
    overridable. Versioned through what it derives.

    Each rung of a ladder and the hero get their own rates, epsilon and beta2 from their own token budget `T`,
    batch `B` (tokens per step) and width `d` (d_model), by one formula family:

        rate     = 0.06602 * T^-0.395 * d^-0.150 * sqrt(B)
        adam_lr  = min(rate, 0.05)
        muonh_lr = adamh_lr = min(13/3 * rate, 0.05)
        epsilon  = 9.676e-18 * sqrt(T / B)
        beta2    = clip(0.999^(B / 131072), 0.95, 0.9999),  beta1 = 0.9062

    with a linear decay to 5% of the peak. The cap holds every group's rate, as published: the MuonH and AdamH
    rates reach it first (at the tiny hero's d768 rung, 13/3 x 0.01226 = 0.0531 is trained at 0.05). The
    constants are Marin's published ones; a refit is a new `version` (and so a new hash for every run that uses
    it: the derived figures are what the train steps hash).
    For example a run of 2^30 tokens in steps of 2^20 at d_model 2048 gets adam_lr 0.00584, muonh_lr 0.0253,
    beta2 0.9920 and epsilon 3.1e-16: `MoeHeuristic().hyperparameters(2**30, 2**20, 2048)`.
    """

    version: str = "marin-8435"
    """Which constants these are; change it with any constant."""
    lr_coefficient: float = 0.06602
    tokens_exponent: float = -0.395
    width_exponent: float = -0.150
    max_lr: float = 0.05
    """The highest peak rate of any group (Adam's, MuonH's and AdamH's alike)."""
    muonh_over_adam: float = 13 / 3
    epsilon_coefficient: float = 9.676e-18
    beta2_base: float = 0.999
    beta2_reference_batch: int = 131_072
    """Tokens per step at which beta2 is `beta2_base`; beta2 is per token, so a batch of B tokens takes its
    B / reference-th power."""
    beta2_range: tuple[float, float] = (0.95, 0.9999)
    beta1: float = 0.9062
    min_lr_ratio: float = 0.05
    """The linear decay's end, over the peak."""
    lr_schedule: str = "linear"

    def uncapped_adam_lr(self, tokens: float, tokens_per_batch: float, hidden_dim: int) -> float:
        """The formula's Adam rate before the cap (`max_lr`)."""
        rate = self.lr_coefficient * tokens**self.tokens_exponent * hidden_dim**self.width_exponent
        return rate * math.sqrt(tokens_per_batch)

    def hyperparameters(self, tokens: float, tokens_per_batch: float, hidden_dim: int) -> HeroHyperparameters:
        """The hero optimizer's settings for a run of `tokens` tokens in steps of `tokens_per_batch`, width
        `hidden_dim`."""
        if tokens <= 0 or tokens_per_batch <= 0 or hidden_dim <= 0:
            raise ValueError(
                f"MoeHeuristic needs positive tokens, batch and width, got tokens={tokens}, "
                f"tokens_per_batch={tokens_per_batch}, hidden_dim={hidden_dim}"
            )
        rate = self.uncapped_adam_lr(tokens, tokens_per_batch, hidden_dim)
        matrix_rate = min(self.muonh_over_adam * rate, self.max_lr)
        low, high = self.beta2_range
        return HeroHyperparameters(
            adam_lr=min(rate, self.max_lr),
            muonh_lr=matrix_rate,
            adamh_lr=matrix_rate,
            beta1=self.beta1,
            beta2=min(max(self.beta2_base ** (tokens_per_batch / self.beta2_reference_batch), low), high),
            epsilon=self.epsilon_coefficient * math.sqrt(tokens / tokens_per_batch),
        )


NEWTON_SCHULZ_SCHEDULES = ("aol", "polar_express", "quintic", "simple")
"""The names of Levanter's `NEWTON_SCHULZ_COEFFICIENTS` schedules (levanter/optim/util.py), whose triples
steps/train/optimizer.py reads from Levanter itself; tests/steps/train/test_optimizer.py holds these names to
Levanter's table."""


def check_optimizer(name: str, hero: HeroHyperparameters | None) -> None:
    """Refuse an optimizer the train step cannot build: an unknown name, or `hero` without its settings."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer={name!r} is none of {OPTIMIZERS}")
    if name == "hero" and hero is None:
        raise ValueError("optimizer='hero' needs hero_hyperparameters (`MoeHeuristic` derives them)")


class TrainInputError(ValueError):
    """The train step's inputs cannot make a run: reported before any compute is spent."""


@dataclass(frozen=True)
class TrainConfig:
    """One training run."""

    shape: MoeShape
    """Model shape (width, layers, experts, top-k, vocabulary, sequence length). Versioned."""
    tokenizer_path: str
    """The train_tokenizer output the caches were tokenized with. A dependency."""
    components: Mapping[str, str]
    """Data component name -> tokenize step output (holding `train/` and `validation/` caches). Dependencies;
    each component's validation split is evaluated on its own (`eval/<name>/loss`)."""
    output_path: str
    """Where checkpoints, metrics.jsonl, wandb/ and logs/ go (THIS_OUTPUT_PATH)."""
    num_train_steps: int
    """Optimizer steps. Versioned."""
    train_batch_size: int
    """Sequences per step; must split evenly over the devices (and microbatches). Versioned."""
    weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]] | None = None
    """Mixture weight per component (default: equal), or phases `[(start_step, weights), ...]` that may start at
    any step: the batches before a change are the ones the run without it reads (steps/train/data_order.py).
    Versioned."""
    components_path: str | None = None
    """A `per_folder` tokenize output (one cache pair per cell): its components.json adds components at run
    time, so a DAG need not know how many cells came out non-empty; its `train_only` cells (no validation
    documents) are trained on and not evaluated. A dependency."""
    mixture_weights_path: str | None = None
    """A mixture_weights output: per-phase weights over the components, each phase starting at its share of
    the steps (on a mixture block); replaces `weights`. Components it gives no weight are validation-only;
    weights on cells that tokenize left out are dropped, logged and recorded in `mixture.json`; a weight on any
    other name that is not a component (a typo) is refused. A dependency."""
    mixture_block_size: int = 2048
    """Sequences per block of Levanter's mixture (weights hold exactly within a block). Versioned."""
    phase_steps: Sequence[int] | None = None
    """The steps the mixture_weights phases after the first start at, any steps (the hero: its new mixture from
    step 108,000); None: each at its share of the run, on a mixture block. Versioned."""
    eval_suite_path: str | None = None
    """An eval_suite output (steps/tokenize/eval_suite.py): its subsets are evaluated as validation-only
    components `suite/<subset>`, logged as `eval/suite/<subset>/loss` and `eval/suite/macro_loss` (the ladder's
    metric; the evaluate step reads the same sequences). A dependency."""
    prediction_path: str | None = None
    """A scaling step output whose predicted loss curve this run is watched against (the dashboard's run
    view overlays it). A dependency: the prediction is registered before the run starts."""
    learning_rate: float = 3e-3
    """Peak learning rate. Versioned."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay. Versioned."""
    warmup: float = 0.1
    """Warm-up, as a fraction of the steps. Versioned."""
    min_lr_ratio: float = 0.1
    """Final learning rate over peak. Versioned."""
    lr_schedule: str = "cosine"
    """Levanter schedule name: cosine, linear, constant, inv_sqrt, wsd... Versioned."""
    optimizer: str = "adamw"
    """"adamw" (one AdamW at `learning_rate`) or "hero" (MuonH on matrices, AdamH on the readout, Adam on the
    rest, at `hero_hyperparameters`' rates; steps/train/optimizer.py). Versioned where it is not the default
    (`versioned_unless_default`), so that AdamW runs keep their hashes."""
    hero_hyperparameters: HeroHyperparameters | None = None
    """The hero optimizer's rates, betas and epsilon (`MoeHeuristic` derives them
    from the run's tokens, batch and width); needed by "hero", unused by "adamw". Versioned."""
    router_aux_loss_coef: float | None = 0.001
    """Weight of the HF load-balancing loss (None: off). Versioned."""
    router_bias_balancing: bool = False
    """Aux-loss-free router-bias balancing, the hero's rule (steps/model/moe_model.py). Versioned."""
    router_z_loss_weight: float = 0.0
    """Weight of the router z-loss: logsumexp(router logits)^2, mean over tokens, summed over layers. Versioned."""
    capacity_factor: float | None = None
    """Tokens an expert takes per sequence, as a multiple of a fair share; the rest are dropped (the hero: 1.15),
    in training and in the periodic evals. None: dropless. Capacity runs the experts as one batched matmul, much
    faster on CPU. Versioned."""
    router_combine: str = "softmax"
    """Gate of the chosen experts' outputs: "softmax" or the hero's "sigmoid" (steps/model/config.py). Versioned."""
    router_combine_sum: float = 1.0
    """What the chosen experts' weights are renormalised to sum to (the hero: 2.5). Versioned."""
    compute_dtype: str = "float32"
    """What the forward and backward passes compute in: "float32", or "bfloat16" over float32 master weights,
    gradients and AdamW moments (Levanter's mixed-precision policy `p=f32,c=<compute_dtype>`). Versioned:
    bf16 rounds every activation."""
    z_loss_weight: float = 0.0
    """Weight of the output logits' z-loss (log-sum-exp squared). Versioned."""
    seed: int = 0
    """Seeds the initialisation, the data shuffle and the mixture. Versioned."""
    steps_per_eval: int = 100
    """Evaluate every component's validation split every this many steps. Plain."""
    max_eval_batches: int | None = None
    """Cap on eval batches per component (None: the whole split). Plain."""
    eval_batch_size: int | None = None
    """Sequences per eval batch, over all devices (None: the train batch, Levanter's default). Set it, with
    `max_eval_batches`, to the evaluate step's batch and batches, so both read the same sequences whatever the
    train batch. Plain."""
    checkpoint_every_steps: int = 1000
    """Permanent checkpoints every this many steps. Plain."""
    temporary_checkpoint_seconds: float = 600.0
    """A temporary checkpoint (only the latest kept) at most this often: what a killed run resumes from. Plain."""
    watch_interval: int = 10
    """Log gradient and parameter norms (total and per parameter) every this many steps. Plain."""
    compile_once: bool | None = None
    """One train step compiled, the watch inside it under a condition (`MoeWatchConfig.compile_once`), instead of
    Levanter's two (with and without the watch). None: once for runs under `COMPILE_ONCE_BELOW_STEPS` steps, where a
    compile is a large share of the run. Plain."""
    per_device_parallelism: int = -1
    """Sequences per device per microbatch (-1: the whole batch at once, no gradient accumulation). Plain: the router
    bias is updated from the whole batch's statistics, so microbatching changes nothing but rounding (which, over
    many steps, can flip a near-tied routing choice: docs/training.md, "Microbatches and the whole batch")."""
    remat: str = "none"
    """What the backward pass recomputes: "none", "layer" or "period" (steps/model/config.py); the memory plan
    chooses it with the microbatch (steps/train/parallelism.py). Plain: it changes memory and time, not results."""
    mesh: Mapping[str, int] | None = None
    """The plan's device mesh, `{"data": D, "expert": E}` over all D x E devices (or `{"domain": R, "data": D,
    "expert": E}` over R fast domains, `domain` x `data` then splitting as `data` does): the batch and the dense weights
    (FSDP) split over both, routed experts over `expert` and FSDP over `data` (steps/model/levanter_config.py's
    `trainer_mesh`). None: Levanter's default, every device on `data`. Plain: layout, not what is computed."""
    peak_flops_per_device: float | None = None
    """Dense bf16 peak FLOP/s of one device (steps/train/hardware.py); `mfu` in metrics.jsonl divides by it
    times the devices the run sees (None: MFU not logged). Plain."""
    wandb_project: str = "moe-train"
    """wandb project name (offline unless WANDB_MODE says otherwise). Plain."""
    hf_export: bool = True
    """After training, export the final checkpoint under `hf/` (steps/model/hf_export.py). Plain."""
    skip_batches: Sequence[tuple[int, int]] = ()
    """[first step, end step) ranges of the data order never trained on, e.g. a rollback past a loss spike:
    step t then trains on the t-th batch outside them (`fork_of(run, step=N, skip_batches=versioned(...))`).
    Versioned."""
    max_epochs: float | None = None
    """No component is read more than this many times its length while sampling: a component reaching its cap
    leaves the mixture and its weight goes to the others (None: uncapped, an exhausted one restarts). Versioned."""
    initialize_from: str | None = None
    """A checkpoint of another run to start from (a fork / rollback), `output_path_of(run, "checkpoints/step-N")`:
    a dependency, hashed through that run's hash and the step. Ignored once the fork has checkpoints of its own."""
    alerts: dict[str, float | str] | None = None
    """Alert thresholds by `executor.watch.training.alerts.AlertRules` field name (None: its defaults), read by
    `python -m executor publish` while the run goes on. Plain: tuning an alert never restarts a run."""

    def check_settings(self) -> None:
        """Refuse a schedule or an optimizer no run can train with (`check_optimizer_settings` below,
        `check_optimizer`); the planner calls it, before anything loads JAX."""
        check_optimizer_settings(
            self.num_train_steps, self.learning_rate, self.warmup, self.min_lr_ratio, self.weight_decay
        )
        try:
            check_optimizer(self.optimizer, self.hero_hyperparameters)
        except ValueError as error:
            raise TrainInputError(str(error)) from error


def check_optimizer_settings(
    num_train_steps: int, learning_rate: float, warmup: float, min_lr_ratio: float, weight_decay: float
) -> None:
    """Raise TrainInputError naming each setting a run cannot train with, and what to set instead."""
    problems = []
    if isinstance(num_train_steps, bool) or not isinstance(num_train_steps, int) or num_train_steps < 1:
        problems.append(f"num_train_steps={num_train_steps!r} must be a whole number of steps, at least 1")
    if not _finite(learning_rate) or learning_rate <= 0:
        problems.append(f"learning_rate={learning_rate!r} must be a finite number above 0 (the peak rate, e.g. 3e-3)")
    if not _finite(weight_decay) or weight_decay < 0:
        problems.append(f"weight_decay={weight_decay!r} must be a finite number, 0 or more")
    if not _finite(min_lr_ratio) or not 0 <= min_lr_ratio <= 1:
        problems.append(f"min_lr_ratio={min_lr_ratio!r} (final over peak learning rate) must lie in [0, 1]")
    if not _finite(warmup) or warmup < 0:
        problems.append(f"warmup={warmup!r} must be a fraction of the run in [0, 1) or a number of steps")
    elif warmup >= 1 and isinstance(num_train_steps, int) and warmup > num_train_steps >= 1:
        longer = f"warmup={warmup!r} steps is longer than the run (num_train_steps={num_train_steps})"
        problems.append(f"{longer}; give a fraction below 1 or fewer steps")
    if problems:
        raise TrainInputError("; ".join(problems))


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
