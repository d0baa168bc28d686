"""Compressed downloads around any method (`compression.down`; docs/compression.md; the encodings in
distfl/compression/download.py).

The server keeps its float32 model. Each client of round t receives the decoded model (fp16, bf16 or
QSGD-quantised parameters, the quantisation keyed by (seed, t, tensor)) and trains from it: its update
is taken against the model it received (`run.global_params`), and the server adds the round's mean
update to its own model. `bytes_down` counts the encoded parameters (buffers and SCAFFOLD's control as
float32). Decoded once per round, on every rank alike.
"""
from __future__ import annotations

from dataclasses import replace

from ..compression.download import ModelDownload
from ..errors import ConfigError
from ..federation.aggregate import Segment
from .feature import Feature


def check_config(v: dict) -> None:
    """One line for a download setting no run can serve."""
    if v["system.async_mode"] != "none":
        raise ConfigError(f"compression.down={v['compression.down']} with system.async_mode={v['system.async_mode']}: "
                          "asynchronous clients start from the model version they downloaded, which is kept "
                          "uncompressed; use a synchronous run")


class Downloaded(Feature):
    feature_name = "download"
    keys = ("compression.down", "compression.down_bits")
    order = 35  # outside the upload's compression, inside DP

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.compression.down != "none"

    @classmethod
    def refuse(cls, v: dict, method: type) -> None:
        check_config(v)

    def __init__(self, inner, cfg, setting):
        super().__init__(inner, cfg, setting)
        worker = setting.worker
        c = cfg.compression
        self._own(download=ModelDownload(c.down, c.down_bits, list(worker.param_slices.values()), cfg.seed),
                  round_idx=0, received=None)

    def download_segments(self) -> list[Segment]:
        return [replace(s, encoded_bytes=(self.download.bits(s.numel) + 7) // 8) if s.name == "params" else s
                for s in self.inner.download_segments()]

    def begin_round(self, round_idx: int) -> None:
        self.round_idx, self.received = round_idx, None
        self.inner.begin_round(round_idx)

    def begin_client(self, run, worker) -> None:
        """The client starts from the model it received, not the server's."""
        if self.received is None:
            self.received = self.download.decode(run.global_params, self.round_idx)
        worker.params.copy_(self.received)
        run.global_params = self.received
        self.inner.begin_client(run, worker)

    def client_statistics(self, run, worker, stats) -> None:
        # Defined here so that a pack of clients adds each one's update against the model it received
        # (run.global_params), never against the server's model (pack.pack_statistics).
        self.inner.client_statistics(run, worker, stats)
