"""FetchSGD around FedAvg or FedProx (`compression.up: sketch`; docs/compression.md; the server's sketches
in distfl/compression/fetchsgd.py).

Each client adds the count sketch of its update (rows x columns values, segment `delta_sketch`) into the
round's exact sum with its weight, in place of the update itself: the sketch is linear, so the summed
sketches are the sketch of the weighted mean update. The server keeps momentum (`server.momentum` is
FetchSGD's rho) and error in sketch space, unsketches the k = ceil(compression.density x d) largest
coordinates and adds them to the model. The hashes are keyed by the seed, the server's two sketches are
server state (checkpointed), so the run is the same on 1 or N ranks and after a resume.
"""
from __future__ import annotations

import torch

from ..compression.fetchsgd import FetchSGDServer, kept
from ..errors import ConfigError
from ..federation.aggregate import Segment
from .compressed import _Staged
from .feature import Feature

SEGMENT = "delta_sketch"


def check_config(v: dict) -> None:
    """One line for a FetchSGD setting no run can serve (after compressed.check_config's general rules)."""
    method = v["algorithm.name"]
    if method not in ("fedavg", "fedprox"):
        raise ConfigError(f"compression.up=sketch (FetchSGD) takes over the server step; algorithm.name={method} has a "
                          "server step or client state of its own: use fedavg or fedprox")
    if v["server.optimizer"] != "sgd":
        raise ConfigError(f"compression.up=sketch (FetchSGD) keeps the server's momentum and error in sketch space and "
                          f"applies the unsketched top-k itself; server.optimizer={v['server.optimizer']} is another "
                          "server step: use server.optimizer=sgd (server.momentum is FetchSGD's momentum)")
    if v["aggregation.fedbn"]:
        raise ConfigError("compression.up=sketch (FetchSGD) with aggregation.fedbn=true: FedBN keeps BatchNorm "
                          "coordinates out of the update, which a sketch of the whole update does not; use one or the other")
    if v["privacy.mechanism"] != "none":
        raise ConfigError(f"compression.up=sketch with privacy.mechanism={v['privacy.mechanism']}: the mechanism clips "
                          "and noises each client's decoded update, and a FetchSGD client sends a sketch; use another "
                          "compression.up")
    if v["system.async_mode"] != "none":
        raise ConfigError(f"compression.up=sketch with system.async_mode={v['system.async_mode']}: the asynchronous "
                          "server adds stale model updates, not sketches; use a synchronous run")


class Sketched(Feature):
    feature_name = "sketch"
    keys = ("compression.up", "compression.rows", "compression.columns", "compression.density")
    order = 30  # compression's place (compression.up picks this or compressed.py, never both); inside DP

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.compression.up == "sketch"

    @classmethod
    def refuse(cls, v: dict, method: type) -> None:
        from .compressed import check_config as check_compression

        check_compression(v)
        check_config(v)

    def __init__(self, inner, cfg, setting):
        super().__init__(inner, cfg, setting)
        c = cfg.compression
        self._own(server=FetchSGDServer(inner.num_params, c.rows, c.columns, kept(c.density, inner.num_params),
                                        cfg.seed, inner.device),
                  rho=float(cfg.server.momentum))

    def segments(self) -> list[Segment]:
        return [Segment(SEGMENT, self.server.size) if s.name == "delta" else s for s in self.inner.segments()]

    def client_statistics(self, run, worker, stats) -> None:
        staged = _Staged(stats, ("delta",))
        self.inner.client_statistics(run, worker, staged)
        for _, value, weight in staged.parts:
            stats.add(SEGMENT, self.server.client_sketch(value.to(torch.float32)), weight)

    def server_update(self, params: torch.Tensor, buffers: torch.Tensor, reduced) -> None:
        """FedAvg's server step with FetchSGD's update in place of the mean delta (server lr and momentum
        inside the sketch: compression/fetchsgd.py)."""
        delta = self.server.step(reduced[SEGMENT], self.inner.server_opt.lr, self.rho)
        params.add_(delta.to(params.dtype))
        buffers.copy_(reduced["buffers"])

    def server_state(self) -> dict:
        return {**self.inner.server_state(), "fetchsgd": self.server.state_dict()}

    def load_server_state(self, state: dict) -> None:
        self.inner.load_server_state(state)
        self.server.load_state_dict(state["fetchsgd"])
