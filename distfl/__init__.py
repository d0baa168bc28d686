"""distfl: federated-learning research trainer on torch.distributed.

The public API for methods and models in your own package (docs/extending.md): `distfl.Algorithm` (the
hook interface), `distfl.Feature` (a cross-cutting feature around any method), `distfl.Segment` (a named
statistic in the round's one all_reduce) and `distfl.Classifier` (features + head, what `model.head` and FedBN work on). From a notebook or a script,
`distfl.train(config, **overrides)` runs what `distfl train` runs and `distfl.report(...)` what
`distfl report` does (distfl.api, docs/python.md). They load
on first use, so `import distfl` stays free of torch.
"""

import os

# Deterministic cuBLAS reads this once, at the process's first cuBLAS call: set it before any such call
# can happen (a notebook, pytest or code embedding the trainer may call cuBLAS before dist.init).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# A torchrun worker watches its launcher from its first moment (distfl/launcher.py): a rank orphaned
# while it is still starting stops at once instead of waiting on, or joining, a dead launch's store.
from . import launcher as _launcher  # noqa: E402

_launcher.start_watch()

__version__ = "0.1.0"
__all__ = ["Algorithm", "Classifier", "Feature", "RunResult", "Segment", "__version__", "report", "train"]

_PUBLIC = {"Algorithm": "distfl.algorithms.base", "Feature": "distfl.algorithms.feature", "Segment": "distfl.federation.aggregate",
           "Classifier": "distfl.models.base", "train": "distfl.api", "report": "distfl.api", "RunResult": "distfl.api"}


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'distfl' has no attribute {name!r}")
