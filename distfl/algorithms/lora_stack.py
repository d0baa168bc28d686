"""FLoRA's stacking (`model.lora.aggregate: stack`; Wang et al., *FLoRA: Federated Fine-Tuning Large Language
Models with Heterogeneous Low-Rank Adaptations*, NeurIPS 2024), around a method whose clients send only their
model update and whose server uses only the sum (FedAvg, FedProx, ...).

Each round every client trains fresh adapters from B = 0 and the round's A. Stacking the clients' factors
along the rank, A = [A_1; ...; A_K] and B = [w_1 B_1, ..., w_K B_K], gives B A = sum_i w_i B_i A_i, the
exact weighted sum of the products, which the server merges into the frozen base:

  W <- W + server.lr * (alpha / r) * sum_i w_i B_i A_i        for every adapted W

then the adapters start again: B = 0 and A a new draw keyed by (seed, round). The sum travels in distfl's
exact fixed-point sum as the products themselves: each client adds w_i B_i A_i, the product the server
computes from the factors it receives (PEFT's `get_delta_weight`: the same numbers the adapter adds to W
in the forward pass), so the merged base is the same on any number of ranks and in packs. A client still
uploads only its factors, 2 r (d_in + d_out) numbers per adapted W (the segment's `encoded_bytes`). The
download is the stacked factors of a cohort of train.clients_per_round clients, K r (d_in + d_out) numbers
per adapted W, or the merged dense update d_in d_out if that is fewer; a fresh A is drawn by every
client from the run's seed and B is zero, so neither is sent. The base lives in the worker's frozen
tensors, which the checkpoint holds (run_state.GlobalModel), so a resume continues from the merged base.
"""
from __future__ import annotations

import math

import torch

from ..compression.base import keyed_generator
from ..errors import ConfigError
from ..federation.aggregate import Segment
from .feature import Feature

ADAPTER = "default"  # PEFT's adapter name
_A_STREAM = 0x5A7C  # the keyed stream of the re-drawn A (distinct from every other keyed draw of a run)


# What model.lora_aggregate=stack merges is the sum of the products (clipped and noised under central DP): the
# keys that change a round's sum or server step otherwise, with the values it takes.
STACK_NEEDS = {"privacy.mechanism": ("none", "gaussian"), "compression.up": ("none",), "secagg.bits": (0,),
               "aggregation.mask": ("none",), "aggregation.fedbn": (False,), "system.async_mode": ("none",),
               "server.optimizer": ("sgd",), "server.momentum": (0.0,), "eval.finetune_from": ("last",)}


def check_stack(v: dict, method: type) -> None:
    """One line for a run model.lora_aggregate=stack cannot make (the merge replaces the server step)."""
    if not getattr(method, "private_release", False):
        raise ConfigError(f"model.lora_aggregate=stack merges the clients' summed products into the base in place of "
                          f"the server step, which algorithm.name={v['algorithm.name']} has its own of: use a method "
                          "whose server uses only the clients' summed updates (fedavg, fedprox, ...) or "
                          "model.lora_aggregate=fedit|ffa")
    for key, allowed in STACK_NEEDS.items():
        if v[key] not in allowed:
            raise ConfigError(f"model.lora_aggregate=stack sums the clients' products exactly and merges them into the "
                              f"base; {key}={v[key]!r} is not supported with it (set {key} to "
                              f"{' or '.join(map(repr, allowed))}, or model.lora_aggregate=fedit|ffa)")


class AdaptedLayer:
    """One adapted layer: its module (a PEFT LoRA layer), where its A and B sit in the flat vector."""

    def __init__(self, name: str, module, slices: dict[str, slice]):
        self.name, self.module = name, module
        self.a = slices[f"{name}.lora_A.{ADAPTER}.weight"]
        self.b = slices[f"{name}.lora_B.{ADAPTER}.weight"]
        self.a_shape = module.lora_A[ADAPTER].weight.shape
        self.weight = module.base_layer.weight
        rank = self.a_shape[0]
        d_in = math.prod(self.a_shape[1:])
        d_out = self.weight.numel() // d_in
        self.adapter_numel = rank * (d_in + d_out)
        self.rank, self.d_in, self.d_out = rank, d_in, d_out


class LoraStack(Feature):
    feature_name = "lora_stack"
    keys = ("model.lora_rank", "model.lora_aggregate")
    order = 5  # right around the method: the products replace its update before any other feature sees it

    @classmethod
    def enabled(cls, cfg) -> bool:
        return bool(cfg.model.lora_rank) and cfg.model.lora_aggregate == "stack"

    @classmethod
    def refuse(cls, v: dict, method: type) -> None:
        check_stack(v, method)

    def __init__(self, inner, cfg, setting):
        super().__init__(inner, cfg, setting)
        worker = setting.worker
        layers = [AdaptedLayer(name, m, worker.param_slices) for name, m in worker.module.named_modules()
                  if hasattr(m, "lora_A") and ADAPTER in getattr(m, "lora_A", {})]
        cohort = cfg.train.clients_per_round
        self._own(layers=layers, round_idx=0, stack_seed=cfg.seed,
                  products_numel=sum(layer.weight.numel() for layer in layers),
                  upload_numbers=sum(layer.adapter_numel for layer in layers),
                  download_numbers=sum(min(cohort * layer.adapter_numel, layer.d_in * layer.d_out) for layer in layers))

    def begin_round(self, round_idx: int) -> None:
        self.round_idx = round_idx
        self.inner.begin_round(round_idx)

    def segments(self) -> list[Segment]:
        # Travels as the clients' factors (4 bytes a number); summed as their products.
        return [Segment("lora_products", self.products_numel, encoded_bytes=4 * self.upload_numbers),
                Segment("buffers", self.num_buffers)]

    def download_segments(self) -> list[Segment]:
        return [Segment("stacked_factors", self.download_numbers), Segment("buffers", self.num_buffers)]

    def client_statistics(self, run, worker, stats) -> None:
        with torch.no_grad():
            products = torch.cat([layer.module.get_delta_weight(ADAPTER).reshape(-1) for layer in self.layers])
        stats.add("lora_products", products, run.weight)
        stats.add("buffers", worker.buffers, run.weight)

    def server_update(self, params: torch.Tensor, buffers: torch.Tensor, reduced) -> None:
        """Merge the round's sum of the products into the base; then B = 0 and next round's A."""
        merged, lr, offset = reduced["lora_products"], self.server_opt.lr, 0
        with torch.no_grad():
            for layer in self.layers:
                w = layer.weight
                step = merged[offset: offset + w.numel()].view(w.shape)
                w.copy_((w.double() + lr * step).to(w.dtype))
                offset += w.numel()
            buffers.copy_(reduced["buffers"])
            fresh_adapters(params, self.layers, self.stack_seed, self.round_idx + 1)


def fresh_adapters(params: torch.Tensor, layers: list[AdaptedLayer], seed: int, round_idx: int) -> None:
    """The adapters round `round_idx` starts from, in the flat vector `params`: B = 0, and each A drawn as PEFT
    draws it (Kaiming-uniform, a = sqrt(5)) from a CPU generator keyed by (seed, round, layer): the same on
    every rank and after a resume."""
    for k, layer in enumerate(layers):
        a = torch.empty(layer.a_shape, dtype=torch.float32)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=keyed_generator(seed, _A_STREAM, round_idx, k))
        params[layer.a].copy_(a.reshape(-1))
        params[layer.b].zero_()
