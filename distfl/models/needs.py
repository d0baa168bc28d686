"""What a method declares it needs of the model (`Algorithm.learnable_head`, `cross_entropy`,
`no_batchnorm`), checked at config validation from model.* and, for a plugin model whose BatchNorm only its
build shows, again when the method is built."""
from __future__ import annotations

from ..errors import ConfigError
from .base import has_batchnorm, loss_kind


def check_model_needs(cls, cfg) -> None:
    """ConfigError if the run's model lacks what method `cls` declares it needs (`learnable_head`,
    `cross_entropy`, `no_batchnorm`), read from model.*: one line naming the keys and what is valid."""
    name, model = cfg.algorithm.name, cfg.model
    if cls.learnable_head and model.head != "linear":
        raise ConfigError(f"algorithm.name={name} trains the model's classifier head; model.head={model.head} is fixed: "
                          "use model.head=linear")
    if cls.cross_entropy and loss_kind(model.loss, model.head) != "ce":
        raise ConfigError(f"algorithm.name={name} {cls.cross_entropy}; this model is trained with MSE (model.head="
                          f"{model.head}, model.loss={model.loss}): use model.head=linear and model.loss=auto")
    if cls.no_batchnorm and has_batchnorm(model.name, model.norm):
        refuse_batchnorm(name, model.name, cls.no_batchnorm)


def check_built_model(cls, cfg, worker) -> None:
    """What `check_model_needs` checks, on the built model: a plugin model's BatchNorm is known only here."""
    if cls.no_batchnorm and (worker.buffers.numel() or worker.int_buffers):
        refuse_batchnorm(cfg.algorithm.name, cfg.model.name, cls.no_batchnorm)


def refuse_batchnorm(name: str, model_name: str, why: str) -> None:
    """ConfigError for a model with BatchNorm statistics, for a method that cannot keep them right (`why`)."""
    raise ConfigError(f"algorithm.name={name} {why}; model.name={model_name} has BatchNorm statistics: use a model "
                      "without BatchNorm (e.g. model.norm=gn)")
