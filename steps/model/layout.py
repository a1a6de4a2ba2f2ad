"""A model's layout on a mesh in numbers, without JAX (a plan reads them; steps/model/levanter_config.py and
expert_parallel.py build the arrays): the devices a batch and a weight's FSDP shard split over
(`data_parallel_size`), the dimensions a mesh would split unevenly (`uneven_splits`), and the slot grid of a
dropless layer's rounds (`DROPLESS_ROUND_FACTOR`)."""

from __future__ import annotations

from collections.abc import Mapping

from steps.model.model_size import MoeShape

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
