"""CUDA graphs for a pack's local steps (runtime.cuda_graphs).

A pack's step (pack.PackStep: `vmap(grad(...))` of the rank's model over P clients) is one call that
launches hundreds of small kernels, and on a GPU the host spends longer launching them than the GPU
spends running them. Captured once as a CUDA graph, the same kernels replay with one launch.

A graph replays fixed kernels on fixed memory, so each input shape gets its own graph (a pack's full
batches and its last, partial batch; a smaller last pack of the cohort), captured the first time the
shape comes, after a warm-up on a side stream as torch's documentation asks. Inputs are copied into
the graph's own tensors before each replay; its outputs are the graph's own tensors too, overwritten
by the next replay, so the caller consumes them at once (`pack._pack_step` does). Everything around the
step stays eager and in order on the same stream: the batch gather, the methods' hooks
(`before_forward`, `correct_gradient`, `after_step`), the SGD step with the lr of the round's schedule
and momentum, the loss sums. Nothing here reads a value on the host, and the step is a pure function
of its inputs (BatchNorm's counters are copied inside it), so a replay computes what the eager call
computes with the same kernels: the same bits (tests/integration/test_cuda.py checks this on a GPU).

A capture that fails (an operation a graph cannot hold, say in a plugin model's forward) is said once,
and every step of the run is then taken eagerly.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch

from ..errors import ConfigError

# Distinct input shapes captured at most: a pack meets two or three (full batches, the last partial one,
# a smaller last pack); clients of many different sizes in one pack meet more, and those run eagerly.
MAX_GRAPHS = 16


class CudaGraphBackend:
    """Captures and replays on the current CUDA device."""

    def warm_up(self, fn: Callable[[], object], times: int = 2) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(times):
                fn()
        torch.cuda.current_stream().wait_stream(side)

    def capture(self, fn: Callable[[], tuple]) -> tuple[Callable[[], None], tuple]:
        """(replay, outputs): `fn` recorded once; replay() runs it again, writing into `outputs`."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = fn()
        return graph.replay, outputs


def backend_for(device: torch.device):
    """The graph backend of a device, or None where there are no graphs (the CPU)."""
    return CudaGraphBackend() if device.type == "cuda" else None


def resolve_cuda_graphs(setting: str, device: torch.device, pack_size: int):
    """runtime.cuda_graphs for this run: the backend that captures pack steps, or None (eager).
    auto: graphs on CUDA when clients train in packs; on: the same, refused where it cannot apply."""
    if setting == "off":
        return None
    backend = backend_for(device)
    if setting == "on" and backend is None:
        raise ConfigError(f"runtime.cuda_graphs=on needs a GPU, and this run trains on {device.type}: "
                          "set runtime.device=cuda, or runtime.cuda_graphs=auto or off")
    if setting == "on" and pack_size == 1:
        raise ConfigError("runtime.cuda_graphs=on captures the local steps of client packs, and this run trains "
                          "one client at a time (runtime.pack_size=1): set runtime.pack_size=0 (auto) or > 1, "
                          "or runtime.cuda_graphs=auto or off")
    return backend if pack_size > 1 else None


class GraphedStep:
    """A pure step function `step(*inputs) -> tuple of tensors`, replayed as one CUDA graph per input
    shape. Called like `step`; returns the graph's output tensors (valid until the next call)."""

    def __init__(self, step: Callable[..., tuple], backend, name: str = "the local step"):
        self.step, self.backend, self.name = step, backend, name
        self.graphs: dict[tuple, tuple] = {}  # shape key -> (static inputs, replay, static outputs)
        self.failed: str | None = None  # why capture was given up (then every call is eager)

    @staticmethod
    def key(inputs: tuple[torch.Tensor, ...]) -> tuple:
        return tuple((tuple(t.shape), t.dtype) for t in inputs)

    def __call__(self, *inputs: torch.Tensor) -> tuple:
        if self.failed is not None:
            return self.step(*inputs)
        key = self.key(inputs)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= MAX_GRAPHS:
                return self.step(*inputs)
            entry = self._capture(key, inputs)
            if entry is None:
                return self.step(*inputs)
        static, replay, outputs = entry
        for target, value in zip(static, inputs):
            target.copy_(value)
        replay()
        return outputs

    def _capture(self, key: tuple, inputs: tuple[torch.Tensor, ...]):
        static = tuple(t.clone() for t in inputs)
        try:
            self.backend.warm_up(lambda: self.step(*static))
            replay, outputs = self.backend.capture(lambda: self.step(*static))
        except Exception as e:  # a graph cannot hold some operation: eager from now on, said once
            self.failed = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            self.graphs.clear()
            warnings.warn(f"runtime.cuda_graphs: {self.name} could not be captured as a CUDA graph "
                          f"({self.failed}); every step of this run is taken eagerly (runtime.cuda_graphs=off "
                          "says so without trying)", RuntimeWarning, stacklevel=3)
            return None
        self.graphs[key] = (static, replay, outputs)
        return self.graphs[key]
