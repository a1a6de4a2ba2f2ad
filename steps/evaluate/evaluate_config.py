"""The evaluate step's config, `EvaluateConfig`, apart from the step (steps/evaluate/evaluate.py): a DAG's
definition builds it without loading JAX or Levanter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from steps.model.model_size import MoeShape


@dataclass(frozen=True)
class EvaluateConfig:
    """One evaluation of a trained model on the validation splits of its data components."""

    checkpoint_path: str
    """A train step's `checkpoints/` folder (its latest complete checkpoint is used) or one `step-N/`. A dependency."""
    shape: MoeShape
    """The shape the checkpoint was trained with. Versioned."""
    tokenizer_path: str
    """The tokenizer of the caches and the model. A dependency."""
    components: Mapping[str, str]
    """Component name -> tokenize step output; its `validation/` cache is evaluated. Dependencies."""
    output_path: str
    """Where results.json goes (THIS_OUTPUT_PATH)."""
    components_path: str | None = None
    """A `per_folder` tokenize output whose components.json adds components (as the train step's). A dependency."""
    eval_suite_path: str | None = None
    """An eval_suite output: its subsets' macro loss becomes `macro_loss` (the train step's
    `eval/suite/macro_loss`). A dependency."""
    batch_size: int = 8
    """Sequences per eval batch, split over every device (a multiple of their number): the train step's
    `eval_batch_size`, so that both read the same sequences. Plain: the loss does not depend on it (Levanter's
    bits per byte move by up to about 1% with it)."""
    mesh: Mapping[str, int] | None = None
    """The plan's device mesh, `{"data": D, "expert": E}`, the train step's layout (`TrainConfig.mesh`): the
    model is loaded FSDP over every device with its routed experts split over `expert`, and each device scores its
    share of every batch. None: Levanter's default, every device on `data`. Plain."""
    max_batches: int | None = None
    """Cap per component, in batches of `batch_size` (None: the whole split). Versioned: it changes the figures."""
    router_combine: str = "softmax"
    """The train step's gate of the chosen experts' outputs (TrainConfig.router_combine). Versioned."""
    router_combine_sum: float = 1.0
    """The train step's sum of the chosen experts' weights (TrainConfig.router_combine_sum). Versioned."""
    capacity_factor: float | None = None
    """The train step's expert capacity (TrainConfig.capacity_factor): scored with it, its dropped fraction, and
    scored dropless too (module docstring). None: dropless only. Versioned."""
