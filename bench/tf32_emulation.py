"""How far TF32 moves TCT's eNTK features, emulated on the CPU (no GPU needed).

On an H100 (2026-11-26), `distfl bench --suite tct --device cuda` found the batched features and
Algorithm 3's loop 1.5e-1 apart for tct_cnn (relative to the largest feature), 1.6e-5 for SimpleCNN,
with torch's default numerics, which allow TF32 convolutions (a run turns TF32 off:
`distfl.dist.cuda_float32_numerics`). TF32 rounds a product's inputs to 10 mantissa bits. This script
rounds the inputs and weights of every Conv2d and Linear forward to 10 mantissa bits in the loop only
(the backward pass stays float32, so this is less rounding than TF32 does),
and compares with the exact float32 features: if such rounding moves features by ~1e-1 (ReLU and
max-pool decisions flip, routing gradients elsewhere), TF32 accounts for the GPU's difference.
Run: PYTHONPATH=. python bench/tf32_emulation.py  (about a minute, 1 thread); output in bench/results/tf32_emulation.txt.
"""
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from distfl.config import load_config
from distfl.data.datasets import load_dataset
from distfl.models import build_model
from distfl.tct.features import coordinate_index, entk_features, entk_features_loop


def tf32(t: torch.Tensor) -> torch.Tensor:
    """t rounded to nearest with 10 mantissa bits (TF32's), as a float32 tensor; gradients pass through
    unchanged (only the forward pass is rounded here)."""
    bits = t.detach().contiguous().view(torch.int32)
    return t + (((bits + 0x1000) & ~0x1FFF).view(torch.float32) - t).detach()


@contextmanager
def tf32_forward():
    conv2d, linear = F.conv2d, F.linear
    F.conv2d = lambda x, w, *rest, **kw: conv2d(tf32(x), tf32(w), *rest, **kw)
    F.linear = lambda x, w, *rest, **kw: linear(tf32(x), tf32(w), *rest, **kw)
    try:
        yield
    finally:
        F.conv2d, F.linear = conv2d, linear


def main() -> None:
    torch.set_num_threads(1)
    data = load_dataset(load_config(None, ["data.dataset=fmnist"]).data, 0)
    print("256 FMNIST training samples, features relative to the largest exact one (max |a - b| / max |b|)")
    for name, p in (("simplecnn", None), ("tct_cnn", 100_000)):
        cfg = load_config(None, ["data.dataset=fmnist", f"model.name={name}"])
        torch.manual_seed(0)
        model = build_model(cfg.model, data.input_shape, data.num_classes)
        num = sum(q.numel() for q in model.parameters())
        index = coordinate_index(num, num if p is None else p, cfg.tct.coordinate_seed, cfg.tct.coordinate_order)
        x = data.train_x[:256]
        exact = entk_features_loop(model, x, index)
        batched = entk_features(model, x, index, chunk_size=cfg.tct.chunk_size)
        with tf32_forward():
            rounded = entk_features_loop(model, x, index)

        def rel(a, b):
            return float((a - b).abs().max() / b.abs().max())

        print(f"{name} (p = {index.numel()}): batched vs loop, float32: {rel(batched, exact):.1e}; "
              f"loop with TF32-rounded forward vs loop, float32: {rel(rounded, exact):.1e}")


if __name__ == "__main__":
    main()
