"""Stage-2 eNTK features of TCT (Yu et al., NeurIPS 2022; tct.md §1.2, §1.4, §1.6).

For the bootstrapped network theta^0 = (phi^B, omega^r) -- the FedAvg model with its last layer
re-initialised at random -- every sample x gets the feature

    z(x) = S( d f_1(x; theta^0) / d theta ) in R^p,

the gradient of the first output logit with respect to the network parameters, flattened in
`model.parameters()` order and restricted to p coordinates drawn once with a seeded `randperm`
(Algorithm 3). The pieces here:

- `reinit_head`:        step (i), the fixed-seed re-initialisation of `model.head` (identical on all ranks);
- `coordinate_index`:   step (iii), the subsampling mask S of Algorithm 3;
- `feature_parameters`: which parameters the gradient is taken over ("all" = Algorithm 3 and the
                        released code, "extractor" = Algorithm 2);
- `entk_features`:      step (ii)+(iii), vectorised with `torch.func` and chunked over samples;
- `entk_features_loop`: Algorithm 3 verbatim (one backward per sample), the reference for tests;
- `feature_bytes`:      storage size of an N x p feature matrix.

Normalisation (z-scoring across clients) and the least-squares fit are not done here.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

__all__ = [
    "reinit_head",
    "coordinate_index",
    "feature_parameters",
    "entk_features",
    "entk_features_loop",
    "feature_bytes",
]

FLOAT16_MAX = torch.finfo(torch.float16).max


def reinit_head(model: nn.Module, seed: int) -> None:
    """Replace `model.head` (an `nn.Linear(d, C)`) with a fresh PyTorch-default initialisation, in place.

    Step (i) of tct.md §1.2 / "Replace omega^B with a freshly randomly initialised linear layer" in
    Algorithm 2. The draw is exactly `nn.Linear(d, C)`'s `reset_parameters` (weight:
    kaiming_uniform(a=sqrt(5)), i.e. U(-1/sqrt(d), 1/sqrt(d)); bias: U(-1/sqrt(d), 1/sqrt(d))), taken
    from a CPU `torch.Generator().manual_seed(seed)` and then copied to the head's device and dtype.
    It does not touch the global RNG, and it is bit-identical on every process, so no broadcast is
    needed (tct.md §6.2).

    The released code uses a 1-output head (`nn.Linear(128, 1)`) and differentiates that output; we
    keep the C-output head and differentiate logit 0 (`entk_features`). Row 0 of our weight and
    bias entry 0 are drawn from the same distribution as the 1-output head's (the bound depends only
    on d), so the non-zero features are equal in distribution. Rows 1..C-1 of the head do not affect
    logit 0: their (C-1)(d+1) gradient coordinates are identically zero when `which="all"` (see
    `feature_parameters`).
    """
    head = model.head
    if not isinstance(head, nn.Linear):
        raise TypeError(f"model.head must be an nn.Linear (got {type(head).__name__})")
    gen = torch.Generator().manual_seed(int(seed))
    weight = torch.empty(head.out_features, head.in_features)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=gen)
    with torch.no_grad():
        head.weight.copy_(weight)
        if head.bias is not None:
            bound = 1.0 / math.sqrt(head.in_features) if head.in_features > 0 else 0.0
            bias = torch.empty(head.out_features).uniform_(-bound, bound, generator=gen)
            head.bias.copy_(bias)


def coordinate_index(num_params: int, p: int, seed: int) -> torch.LongTensor:
    """The subsampling mask S of Algorithm 3: `randperm(num_params, generator seeded with seed)[:p]`.

    Drawn on the CPU from `torch.Generator().manual_seed(seed)`, which yields the same permutation as
    Algorithm 3's `torch.manual_seed(seed); torch.randperm(num_params)`, on every process. The paper
    uses seed 123 and p = 100,000.

    If p > num_params the slice keeps all num_params coordinates, in permuted order, exactly as the
    paper's code would (e.g. SimpleCNN has P = 44,426 < 100,000; tct.md §2.2). The result then has
    length num_params, not p; the caller should log that.
    """
    num_params, p = int(num_params), int(p)
    if num_params < 1 or p < 1:
        raise ValueError(f"num_params and p must be positive (got num_params={num_params}, p={p})")
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randperm(num_params, generator=gen)[:p]


def feature_parameters(model: nn.Module, which: str = "all") -> list[tuple[str, nn.Parameter]]:
    """The parameters the eNTK gradient is taken over, as an ordered list of (name, parameter).

    - "all" (default; Algorithm 3 and the released code): every parameter with `requires_grad`, in
      `model.parameters()` order, the re-initialised head included. With a C-output head the head's
      rows 1..C-1 contribute (C-1)(d+1) coordinates that are always zero (see `reinit_head`), so a
      per-coordinate normalisation must guard sigma = 0 (tct.md §6.1).
    - "extractor" (Algorithm 2's grad over the feature extractor phi): the same without `model.head`.

    The flattened feature vector is the concatenation of these parameters' gradients in this order;
    its length is `sum(p.numel() for _, p in feature_parameters(model, which))`.
    """
    if which == "all":
        excluded: set[int] = set()
    elif which == "extractor":
        excluded = {id(p) for p in model.head.parameters()}
    else:
        raise ValueError(f"which must be 'all' or 'extractor' (got {which!r})")
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in excluded]


def _check_index(num_params: int, index: torch.Tensor) -> None:
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num_params):
        raise ValueError(f"index holds coordinates outside [0, {num_params}) for these parameters")


def _prepare_out(n: int, p: int, out: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    if out is None:
        return torch.empty(n, p, dtype=out_dtype)
    if tuple(out.shape) != (n, p):
        raise ValueError(f"out must have shape ({n}, {p}) (got {tuple(out.shape)})")
    if out.dtype != out_dtype:
        raise ValueError(f"out has dtype {out.dtype} but out_dtype={out_dtype}; pass out_dtype={out.dtype}")
    return out


def _check_range(chunk: torch.Tensor, out_dtype: torch.dtype) -> None:
    # An inf stored in fp16 would only surface later as NaN in the z-scoring; fail here instead.
    if out_dtype == torch.float16 and chunk.numel() and float(chunk.abs().max()) > FLOAT16_MAX:
        raise ValueError("eNTK feature exceeds the float16 range; use out_dtype=torch.float32")


def entk_features(
    model: nn.Module,
    x: torch.Tensor,
    index: torch.Tensor,
    which: str = "all",
    chunk_size: int = 256,
    out_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """N x p eNTK features z_i = (d f_1(x_i; theta) / d theta)[index] (tct.md §1.2 (ii)-(iii), Algorithm 3).

    Same values as `entk_features_loop` (Algorithm 3), vectorised: per-sample gradients of
    `model(x_i)[0, 0]` (output index 0) with `torch.func.vmap(torch.func.grad(...))` over
    `torch.func.functional_call`, `chunk_size` samples at a time. Per chunk only the per-parameter
    gradients (chunk_size x P floats in the model's dtype) are held, and the `index` columns are
    gathered from them directly, so the full P-dimensional gradient is never kept for all N samples.

    The model is put in eval mode (BatchNorm uses its running statistics, as in Algorithm 3) and its
    previous train/eval mode is restored afterwards; parameters, buffers and `.grad` are untouched.
    Computation runs on the model's device; `x` is moved there chunk by chunk.

    Args:
        model: a `distfl.models.Classifier` (any module whose output is B x C works).
        x: N x (input shape) samples.
        index: coordinates to keep (`coordinate_index`), a 1-D integer tensor over the flattened
            gradient of `feature_parameters(model, which)`.
        which: "all" (default) or "extractor", see `feature_parameters`.
        chunk_size: samples per vectorised gradient; bounds memory. Does not change the result.
        out_dtype: float32 (default) or float16 (what the released code stores; half the memory).
            A value outside the float16 range raises ValueError rather than storing inf.
        out: optional existing N x p tensor of dtype `out_dtype` to write into (e.g. a memory-mapped
            one via `torch.from_numpy(np.memmap(...))`); it may live on another device than the model.

    Returns:
        The N x p tensor (`out` when given, else a new CPU tensor).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive (got {chunk_size})")
    index = torch.as_tensor(index, dtype=torch.long).flatten().cpu()
    n = x.shape[0]
    result = _prepare_out(n, index.numel(), out, out_dtype)
    chosen = feature_parameters(model, which)
    if not chosen:
        raise ValueError(f"the model has no trainable parameters for which={which!r}")
    names = [name for name, _ in chosen]
    chosen_ids = {id(p) for _, p in chosen}
    device = chosen[0][1].device
    _check_index(sum(p.numel() for _, p in chosen), index)
    flat_index = index.to(device)
    primals = {name: p.detach() for name, p in chosen}
    # Everything not differentiated (other parameters, BatchNorm buffers) enters as a constant.
    fixed = {name: p.detach() for name, p in model.named_parameters() if id(p) not in chosen_ids}
    fixed.update(dict(model.named_buffers()))

    def logit0(params: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
        return functional_call(model, (params, fixed), (xi.unsqueeze(0),))[0, 0]

    vectorised = vmap(grad(logit0), in_dims=(None, 0))
    layer_wise = _layer_wise_plan(model, chosen)
    offsets, total = [], 0
    for name, p in chosen:
        offsets.append((name, total, total + p.numel()))
        total += p.numel()
    # One chunk x P matrix reused for every chunk; the layer-wise path writes each layer's per-sample
    # gradient straight into its columns, so nothing is concatenated or re-allocated per chunk.
    block_rows = min(chunk_size, n)
    block_dtype = chosen[0][1].dtype
    buffer = torch.empty(block_rows, total, dtype=block_dtype, device=device) if n else None

    was_training = model.training
    model.eval()
    try:
        for start in range(0, n, chunk_size):
            xb = x[start:start + chunk_size].to(device)
            block = buffer[:xb.shape[0]]
            if layer_wise is not None:
                _layer_wise_grads(model, layer_wise, xb, block, offsets)
            else:
                grads = vectorised(primals, xb)
                for name, lo, hi in offsets:
                    block[:, lo:hi].copy_(grads[name].reshape(xb.shape[0], -1))
                del grads
            target = result[start:start + xb.shape[0]]
            if target.dtype == block.dtype and target.device == block.device and result.dtype != torch.float16:
                torch.index_select(block, 1, flat_index, out=target)
            else:
                picked = block.index_select(1, flat_index)
                _check_range(picked, result.dtype)
                target.copy_(picked)
    finally:
        model.train(was_training)
    return result


def _layer_wise_plan(model: nn.Module, chosen) -> dict | None:
    """name -> (module, "weight"|"bias") when every differentiated parameter belongs to a Linear or an
    ungrouped Conv2d used once: then per-sample gradients follow from one batched backward pass."""
    owner = {}
    for mod_name, module in model.named_modules():
        for key, param in module.named_parameters(recurse=False):
            owner[id(param)] = (module, key)
    plan = {}
    for name, param in chosen:
        module, key = owner[id(param)]
        if not (isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and module.groups == 1
                                                   and module.padding_mode == "zeros"
                                                   and not isinstance(module.padding, str))):
            return None
        plan[name] = (module, key)
    return plan


def _layer_wise_grads(model: nn.Module, plan: dict, xb: torch.Tensor, block: torch.Tensor, offsets) -> None:
    """Per-sample gradients of logit 0 for Linear/Conv2d parameters from one batched backward pass,
    written into `block` (B x P): parameter `name` fills columns lo:hi for each (name, lo, hi) in `offsets`.

    In eval mode the samples of a batch do not interact, so the gradient of sum_i f_0(x_i) with
    respect to a layer's output, restricted to sample i, is sample i's own. A Linear layer's per-sample
    weight gradient is then g_i a_i^T, a Conv2d's the correlation of a_i with g_i (a: the layer's input,
    g: the gradient at its output), and the bias gradients are g_i (summed over positions for a Conv2d).
    """
    modules = {id(m): m for m, _ in plan.values()}
    inputs, outputs, handles = {}, {}, []

    def forward_hook(module, args, output):
        if id(module) in inputs:
            raise RuntimeError("a layer is used twice in one forward pass; layer-wise gradients do not apply")
        inputs[id(module)], outputs[id(module)] = args[0].detach(), output

    for module in modules.values():
        handles.append(module.register_forward_hook(forward_hook))
    try:
        with torch.enable_grad():
            out = model(xb)
            keys = list(outputs)
            # Gradients at the layers' outputs only: the parameters' .grad are left alone.
            found = torch.autograd.grad(out[:, 0].sum(), [outputs[k] for k in keys], allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    grads = {k: (g if g is not None else torch.zeros_like(outputs[k])).detach() for k, g in zip(keys, found)}
    b = xb.shape[0]
    for name, lo, hi in offsets:
        module, key = plan[name]
        a, g = inputs[id(module)], grads[id(module)]
        dest = block[:, lo:hi]
        if isinstance(module, nn.Linear):
            if key == "weight":
                torch.mul(g.unsqueeze(2), a.unsqueeze(1), out=dest.view(b, g.shape[1], a.shape[1]))
            else:
                dest.copy_(g)
        elif key == "weight":
            dest.view(b, *module.weight.shape).copy_(_per_sample_conv_weight_grad(module, a, g))
        else:
            torch.sum(g.reshape(b, g.shape[1], -1), -1, out=dest)


def _per_sample_conv_weight_grad(module: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """B x (Conv2d weight shape): sample i's weight gradient, the correlation of its input a_i with its
    output gradient g_i (B x O x H' x W'). One grouped convolution over all samples: the batch becomes
    the groups, and stride and dilation swap roles, as in the weight gradient of a convolution."""
    b, o, h_out, w_out = g.shape
    kh, kw = module.kernel_size
    w = F.conv2d(a.transpose(0, 1), g.reshape(b * o, 1, h_out, w_out), stride=module.dilation,
                 padding=module.padding, dilation=module.stride, groups=b)
    # The correlation can reach past the kernel when the stride leaves input rows unused; they are not weights.
    c = a.shape[1]
    return w[:, :, :kh, :kw].reshape(c, b, o, kh, kw).permute(1, 2, 0, 3, 4)


def entk_features_loop(model: nn.Module, x: torch.Tensor, index: torch.Tensor, which: str = "all") -> torch.Tensor:
    """Algorithm 3 (`compute_eNTK`) verbatim: one backward pass per sample; the reference for tests.

    For each i: `model.zero_grad()`, backward of `model(x[i:i+1])[0, 0]` (logit 0; the paper's
    `[0]` relies on its 1-output head), concatenate `p.grad.flatten()` over
    `feature_parameters(model, which)` and keep `[index]`. Eval mode as in the paper (the previous
    mode is restored afterwards). Side effect, as in the paper: the model's `.grad` fields hold the
    last sample's gradient on return. Returns an N x p float32 CPU tensor.
    """
    index = torch.as_tensor(index, dtype=torch.long).flatten()
    params = [p for _, p in feature_parameters(model, which)]
    device = next(model.parameters()).device
    index = index.to(device)
    out = torch.zeros(x.shape[0], index.numel())
    was_training = model.training
    model.eval()
    try:
        for i in range(x.shape[0]):
            model.zero_grad()
            model(x[i:i + 1].to(device))[0, 0].backward()
            g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
            out[i, :] = g[index].float().cpu()
    finally:
        model.train(was_training)
    return out


def feature_bytes(num_samples: int, p: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of an num_samples x p feature matrix of `dtype` (tct.md §5: 60k x 1e5 fp32 = 24 GB)."""
    return int(num_samples) * int(p) * torch.empty((), dtype=dtype).element_size()
