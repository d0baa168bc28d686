"""distfl: federated-learning research trainer on torch.distributed."""

__version__ = "0.1.0"
