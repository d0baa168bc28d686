"""The parts of the run's flat model (federation/local.py's FlatModel) that methods address: the classifier
head's coordinates (FedPer, FedRep, FedBABU, FedALA, FedRoD, FedPAC), each parameter's view of the flat
vector, and the model called at other flat parameters (pFedMe, FedALA)."""
from __future__ import annotations

import torch

from ..errors import ConfigError


def head_coordinates(worker, model_name: str) -> torch.Tensor:
    """Boolean mask over the flat parameters of the model's classifier head: the parameters of the
    `head` module of a `distfl.Classifier` (models/base.py: `forward(x) == head(features(x))`). The
    rest, `features`, is the body. A fixed head (model.head=sphere|fixed_random) has no parameters."""
    mask = torch.zeros(worker.num_params, dtype=torch.bool, device=worker.params.device)
    for name, where in worker.param_slices.items():
        if name.startswith("head."):
            mask[where] = True
    if not bool(mask.any()):
        raise ConfigError(f"model.name={model_name} has no learnable classifier head (model.head must be linear: "
                          "a Classifier's `head` module with parameters)")
    return mask



def flat_views(worker) -> list[tuple[str, slice, torch.Size]]:
    """(name, slice of the flat vector, shape) of each parameter, in the flat layout's order."""
    shapes = {name: p.shape for name, p in worker.module.named_parameters()}
    return [(name, where, shapes[name]) for name, where in worker.param_slices.items()]


def call_at(model, views, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The model's output at the flat parameters `flat` (differentiable in `flat`), its own left as they are."""
    from torch.func import functional_call

    return functional_call(model, {name: flat[where].view(shape) for name, where, shape in views}, (x,))
