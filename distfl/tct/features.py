"""Stage-2 eNTK features of TCT (Yu et al., NeurIPS 2022; tct.md §1.2, §1.4, §1.6).

For the bootstrapped network theta^0 = (phi^B, omega^r) -- the FedAvg model with its last layer
re-initialised at random -- every sample x gets the feature

    z(x) = S( d f_1(x; theta^0) / d theta ) in R^p,

the gradient of the first output logit with respect to the network parameters, flattened in
`model.parameters()` order and restricted to p coordinates drawn once with a seeded `randperm`
(Algorithm 3). The pieces here:

- `reinit_head`:        step (i), the fixed-seed re-initialisation of `model.head` (identical on all ranks);
- `coordinate_index`:   step (iii), the subsampling mask S of Algorithm 3 (drawn or parameter order);
- `feature_parameters`: which parameters the gradient is taken over ("all" = Algorithm 3 and the
                        released code, "extractor" = Algorithm 2);
- `entk_features`:      step (ii)+(iii), batched over chunks of samples: layer-wise for Linear/Conv2d
                        models (only the chosen coordinates are formed), `torch.func` otherwise;
- `feature_method`:     which of the two ways a model takes;
- `entk_features_loop`: Algorithm 3 verbatim (one backward per sample), the reference for tests;
- `feature_bytes`:      storage size of an N x p feature matrix.

Normalisation (z-scoring across clients) and the least-squares fit are not done here.
"""
from __future__ import annotations

import math
import mmap

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
    "feature_method",
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


def coordinate_index(num_params: int, p: int, seed: int, order: str = "drawn") -> torch.LongTensor:
    """The subsampling mask S of Algorithm 3: `randperm(num_params, generator seeded with seed)[:p]`,
    in that order (`order="drawn"`) or sorted into parameter order (`order="parameter"`, the TCT
    phase's default `tct.coordinate_order`): the same coordinates, so the same features up to a fixed
    permutation of their columns, which stage 2 does not see (docs/algorithms/tct.md). In parameter
    order `entk_features` writes every layer whose coordinates are all kept as one block.

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
    if order not in ("drawn", "parameter"):
        raise ValueError(f"order must be 'drawn' or 'parameter' (got {order!r})")
    gen = torch.Generator().manual_seed(int(seed))
    index = torch.randperm(num_params, generator=gen)[:p]
    return index.sort().values if order == "parameter" else index


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


# Outputs from this size on are backed by memory advised for transparent huge pages.
HUGE_PAGE_MIN_BYTES = 1 << 22


def _new_cpu_tensor(n: int, p: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised n x p CPU tensor. A large one lives in private anonymous memory advised for
    transparent huge pages: writing a fresh 256 x 44,426 float32 output page-faulted 4 KiB pages for
    ~25 ms of CPU time, more than computing its values, and ~4 ms with huge pages (where the kernel
    grants them; otherwise this is ordinary memory). The tensor keeps its buffer alive."""
    nbytes = n * p * torch.empty((), dtype=dtype).element_size()
    if nbytes < HUGE_PAGE_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(n, p, dtype=dtype)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(buffer, dtype=dtype).view(n, p)


def _prepare_out(n: int, p: int, out: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    if out is None:
        return _new_cpu_tensor(n, p, out_dtype)
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

    Same values as `entk_features_loop` (Algorithm 3), batched, `chunk_size` samples at a time:

    - layer-wise (every differentiated parameter belongs to a Linear or an ungrouped, zero-padded
      Conv2d, each used once per forward pass; `feature_method`): one batched forward and backward
      pass per chunk gives each layer's input a and output gradient g per sample, and only the
      `index` coordinates are formed from them: a Linear weight entry (o, i) is g[:, o] * a[:, i], a
      bias entry is g[:, o] (summed over positions for a Conv2d), a Conv2d weight entry is read from
      that layer's per-sample weight gradient (`_per_sample_conv_weight_grads`, formed only for a
      layer with a chosen weight coordinate). A parameter whose coordinates are all in `index`, in
      order at consecutive positions (an index in parameter order, `coordinate_index(...,
      order="parameter")`), is written into the output as one block. The chunk x P gradient is
      never formed;
    - otherwise (e.g. BatchNorm layers): per-sample gradients of `model(x_i)[0, 0]` with
      `torch.func.vmap(torch.func.grad(...))` over `torch.func.functional_call` (chunk_size x P
      floats per chunk), from which the `index` columns are gathered.

    The model is put in eval mode (BatchNorm uses its running statistics, as in Algorithm 3) and its
    previous train/eval mode is restored afterwards; parameters, buffers and `.grad` are untouched.
    Computation runs on the model's device; `x` is moved there chunk by chunk.

    Args:
        model: a `distfl.models.Classifier` (any module whose output is B x C works).
        x: N x (input shape) samples.
        index: coordinates to keep (`coordinate_index`), a 1-D integer tensor over the flattened
            gradient of `feature_parameters(model, which)`.
        which: "all" (default) or "extractor", see `feature_parameters`.
        chunk_size: samples per batched gradient; bounds memory. Changes the result only by float
            round-off (batched kernels may sum in another order).
        out_dtype: float32 (default) or float16 (what the released code stores; half the memory).
            A value outside the float16 range raises ValueError rather than storing inf.
        out: optional existing N x p tensor of dtype `out_dtype` to write into (e.g. a memory-mapped
            one via `torch.from_numpy(np.memmap(...))`); it may live on another device than the model.

    Returns:
        The N x p tensor (`out` when given, else a new CPU tensor; from 4 MiB on, one in memory advised
        for transparent huge pages, see `_new_cpu_tensor`).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive (got {chunk_size})")
    index = torch.as_tensor(index, dtype=torch.long).flatten().cpu()
    n = x.shape[0]
    result = _prepare_out(n, index.numel(), out, out_dtype)
    chosen = feature_parameters(model, which)
    if not chosen:
        raise ValueError(f"the model has no trainable parameters for which={which!r}")
    _check_index(sum(p.numel() for _, p in chosen), index)
    owners = _layer_owners(model, chosen)
    plan = _GatherPlan(chosen, owners, index) if owners is not None else None
    vectorised = None

    was_training = model.training
    model.eval()
    try:
        for start in range(0, n, chunk_size):
            xb = x[start:start + chunk_size].to(chosen[0][1].device)
            target = result[start:start + xb.shape[0]]
            if plan is not None:
                try:
                    plan.write(model, xb, target)
                except _NotLayerWise:  # found only when running (e.g. a layer used twice, a Linear on 3-D input)
                    plan = None
                else:
                    continue
            if vectorised is None:
                vectorised = _VmapFeatures(model, chosen, index)
            vectorised.write(xb, target)
    finally:
        model.train(was_training)
    return result


def feature_method(model: nn.Module, which: str = "all") -> str:
    """Which way `entk_features` computes this model's features: "layer-wise" (Linear and Conv2d layers
    only: one batched backward pass per chunk, only the chosen coordinates formed) or "vmap"
    (`torch.func`, chunk x P per-sample gradients). A model that uses a layer twice in one forward pass
    is found only when running, and then falls back to "vmap"."""
    return "layer-wise" if _layer_owners(model, feature_parameters(model, which)) is not None else "vmap"


def _write(picked: torch.Tensor, target: torch.Tensor) -> None:
    _check_range(picked, target.dtype)
    target.copy_(picked)


class _VmapFeatures:
    """Per-sample gradients of logit 0 with `torch.func` for any model: chunk x P, then the index columns."""

    def __init__(self, model: nn.Module, chosen, index: torch.Tensor):
        self.names = [name for name, _ in chosen]
        self.primals = {name: p.detach() for name, p in chosen}
        chosen_ids = {id(p) for _, p in chosen}
        # Everything not differentiated (other parameters, BatchNorm buffers) enters as a constant.
        fixed = {name: p.detach() for name, p in model.named_parameters() if id(p) not in chosen_ids}
        fixed.update(dict(model.named_buffers()))

        def logit0(params: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
            return functional_call(model, (params, fixed), (xi.unsqueeze(0),))[0, 0]

        self.grads = vmap(grad(logit0), in_dims=(None, 0))
        self.index = index.to(chosen[0][1].device)

    def write(self, xb: torch.Tensor, target: torch.Tensor) -> None:
        grads = self.grads(self.primals, xb)
        block = torch.cat([grads[name].reshape(xb.shape[0], -1) for name in self.names], 1)
        del grads
        if target.dtype == block.dtype and target.device == block.device and target.is_contiguous():
            torch.index_select(block, 1, self.index, out=target)
        else:
            _write(block.index_select(1, self.index), target)


class _NotLayerWise(Exception):
    """The model does something the layer-wise path does not cover; use torch.func instead."""


def _layer_owners(model: nn.Module, chosen) -> dict | None:
    """name -> (module, "weight"|"bias") when every differentiated parameter belongs to exactly one
    Linear or ungrouped, zero-padded Conv2d; None otherwise."""
    owner: dict[int, list] = {}
    for module in model.modules():
        for key, param in module.named_parameters(recurse=False):
            owner.setdefault(id(param), []).append((module, key))
    plan = {}
    for name, param in chosen:
        if len(owner[id(param)]) != 1:  # a parameter shared between modules
            return None
        module, key = owner[id(param)][0]
        if not (isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and module.groups == 1
                                                   and module.padding_mode == "zeros"
                                                   and not isinstance(module.padding, str))):
            return None
        plan[name] = (module, key)
    return plan


# Rows gathered at a time: a few rows of the source and of the output stay in cache (measured on
# SimpleCNN's source: 8-64 rows gathered 1.5-2.7x faster per row than 128).
GATHER_ROWS = 32


class _GatherPlan:
    """The layer-wise path. In eval mode the samples of a batch do not interact, so the gradient of
    sum_i f_0(x_i) with respect to a layer's output, restricted to sample i, is sample i's own: one
    backward pass gives every sample's output gradient g at every layer, beside the layer's input a.
    From them, per chunk of samples:

    - a parameter whose every coordinate the index holds, in parameter order at consecutive positions
      (every parameter when the index is sorted and p >= P; `tct.coordinate_order: parameter`), is
      written straight into its block of the output: a Linear weight as the outer products g_i a_i^T,
      a Conv2d weight as the per-sample weight gradients, a bias as g_i (summed over positions for a
      Conv2d);
    - the other coordinates are gathered from a B x S `source` matrix holding, for each layer with such
      a coordinate, the per-sample pieces its gradients are made of: a column of ones; for a Linear
      layer g (B x O) and a (B x I); for a Conv2d layer its per-sample weight gradient
      (B x weight.numel()) and g summed over positions (B x O). Feature j is then
      source[:, left[j]] * source[:, right[j]]: Linear weight (o, i): g_o * a_i; Linear bias o: g_o * 1;
      Conv2d weight or bias entry: entry * 1.
    """

    def __init__(self, chosen, owners: dict, index: torch.Tensor):
        device = chosen[0][1].device
        self.dtype = chosen[0][1].dtype
        sizes = torch.tensor([p.numel() for _, p in chosen])
        start = torch.cumsum(sizes, 0) - sizes
        owner_of = torch.searchsorted(torch.cumsum(sizes, 0), index, right=True)
        local = index - start[owner_of]

        # Whole parameters at consecutive positions, in order: written directly (`blocks`).
        self.blocks: list[tuple[str, nn.Module, int, int]] = []  # (kind, module, first output column, size)
        direct = torch.zeros(index.numel(), dtype=torch.bool)
        counts = torch.bincount(owner_of, minlength=len(chosen))
        for t, (name, param) in enumerate(chosen):
            size = param.numel()
            if int(counts[t]) != size:
                continue
            lo = int((owner_of == t).nonzero()[0])
            if not torch.equal(index[lo:lo + size], start[t] + torch.arange(size)):
                continue
            module, key = owners[name]
            kind = key if key == "bias" else ("linear_weight" if isinstance(module, nn.Linear) else "conv_weight")
            self.blocks.append((kind, module, lo, size))
            direct[lo:lo + size] = True
        rest = (~direct).nonzero().flatten()
        self.rest = rest.numel()
        # The gathered columns as runs of consecutive output columns: (first column, end, first gathered).
        breaks = (torch.nonzero(rest[1:] - rest[:-1] != 1).flatten() + 1).tolist()
        edges = [0] + breaks + [self.rest]
        self.runs = [(int(rest[i]), int(rest[j - 1]) + 1, i) for i, j in zip(edges[:-1], edges[1:]) if j > i]

        self.pieces: list[tuple[str, nn.Module, int]] = []  # (kind, module, first source column)
        placed: dict[tuple[str, int], int] = {}
        width = 1  # column 0: ones

        def column(kind: str, module: nn.Module, size: int) -> int:
            nonlocal width
            if (kind, id(module)) not in placed:
                placed[(kind, id(module))] = width
                self.pieces.append((kind, module, width))
                width += size
            return placed[(kind, id(module))]

        # Gathered coordinate k of parameter t (local coordinate k - start[t]) is
        #   left  = left_base[t]  + local // divisor[t]
        #   right = right_base[t] + local %  divisor[t]
        # divisor = in_features for a Linear weight (entry (o, i) = g_o * a_i), else 1 with right = 0 (ones).
        owner_of, local = owner_of[rest], local[rest]
        used = torch.bincount(owner_of, minlength=len(chosen)) > 0
        left_base = torch.zeros(len(chosen), dtype=torch.long)
        right_base = torch.zeros(len(chosen), dtype=torch.long)
        divisor = torch.ones(len(chosen), dtype=torch.long)
        for t, (name, _) in enumerate(chosen):
            if not used[t]:
                continue
            module, key = owners[name]
            if isinstance(module, nn.Linear):
                left_base[t] = column("g", module, module.out_features)
                if key == "weight":
                    right_base[t] = column("a", module, module.in_features)
                    divisor[t] = module.in_features
            elif key == "weight":
                left_base[t] = column("conv_weight", module, module.weight.numel())
            else:
                left_base[t] = column("g_sum", module, module.out_channels)
        d = divisor[owner_of]
        self.width = width
        self.left = (left_base[owner_of] + local.div(d, rounding_mode="floor")).to(device)
        right = right_base[owner_of] + local.remainder(d)
        self.right = right.to(device) if bool((right != 0).any()) else None  # None: every factor is 1
        self.modules = list({id(m): m for m in [m for _, m, _ in self.pieces] + [m for _, m, _, _ in self.blocks]}.values())

    def write(self, model: nn.Module, xb: torch.Tensor, target: torch.Tensor) -> None:
        """target (B x p) = the chunk's features."""
        inputs, grads = self._layers(model, xb)
        for kind, module, lo, size in self.blocks:
            a, g = inputs[id(module)], grads[id(module)]
            dest = target[:, lo:lo + size]
            if kind == "bias":
                _write(g.sum((2, 3)) if g.dim() == 4 else g, dest)
                continue
            shaped = dest.view(xb.shape[0], *module.weight.shape)
            on_target = dest.dtype == self.dtype and dest.device == xb.device
            block = shaped if on_target else torch.empty(shaped.shape, dtype=self.dtype, device=xb.device)
            if kind == "linear_weight":  # one product per entry: exact (bmm writes a strided block ~1.5x faster than mul)
                torch.bmm(g.unsqueeze(2), a.unsqueeze(1), out=block)
            else:
                _per_sample_conv_weight_grads(module, a, g, block)
            if not on_target:
                _write(block, shaped)
        if self.rest:
            self._gather(self._source(inputs, grads, xb), target)

    def _layers(self, model: nn.Module, xb: torch.Tensor) -> tuple[dict, dict]:
        """Each hooked layer's input and output gradient for the chunk, by id(module)."""
        inputs, outputs, handles = {}, {}, []

        def forward_hook(module, args, output):
            if id(module) in inputs:
                raise _NotLayerWise("a layer is used twice in one forward pass")
            if not args or args[0].dim() != (2 if isinstance(module, nn.Linear) else 4):
                raise _NotLayerWise("an input passed by keyword, a Linear layer on more than 2-D input "
                                    "or a Conv2d on unbatched input")
            inputs[id(module)], outputs[id(module)] = args[0].detach(), output

        for module in self.modules:
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
        return inputs, grads

    def _source(self, inputs: dict, grads: dict, xb: torch.Tensor) -> torch.Tensor:
        b = xb.shape[0]
        source = torch.empty(b, self.width, dtype=self.dtype, device=xb.device)
        source[:, 0] = 1
        for kind, module, lo in self.pieces:
            a, g = inputs[id(module)], grads[id(module)]
            if kind == "g":
                source[:, lo:lo + g.shape[1]] = g
            elif kind == "a":
                source[:, lo:lo + a.shape[1]] = a
            elif kind == "g_sum":
                source[:, lo:lo + g.shape[1]] = g.sum((2, 3))
            else:
                dest = source[:, lo:lo + module.weight.numel()].view(b, *module.weight.shape)
                _per_sample_conv_weight_grads(module, a, g, dest)
        return source

    def _gather(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """The gathered columns of target = source[:, left] * source[:, right], GATHER_ROWS rows at a time."""
        whole = self.rest == target.shape[1]  # no direct blocks: the gathered columns are all of target's
        direct = whole and target.dtype == source.dtype and target.device == source.device and target.is_contiguous()
        factor = None
        for r in range(0, source.shape[0], GATHER_ROWS):
            rows, dest = source[r:r + GATHER_ROWS], target[r:r + GATHER_ROWS]
            picked = torch.index_select(rows, 1, self.left, out=dest) if direct else rows.index_select(1, self.left)
            if self.right is not None:
                if factor is None:
                    factor = torch.empty(min(GATHER_ROWS, source.shape[0]), self.left.numel(),
                                         dtype=source.dtype, device=source.device)
                picked.mul_(torch.index_select(rows, 1, self.right, out=factor[:rows.shape[0]]))
            if direct:
                continue
            if whole:
                _write(picked, dest)
            else:
                for lo, hi, first in self.runs:
                    _write(picked[:, first:first + hi - lo], dest[:, lo:hi])


# Samples per expanded-weight convolution: as many as keep one call's inputs and output gradients within
# this many bytes (about a core's L2 cache). Measured on CPU, 1 thread: tct_cnn's 32->64 5x5 layer
# (~90 KB a sample) ran 2-2.5x faster per sample 4-16 at a time than 32-128 at a time, SimpleCNN's 6->16
# layer (~8 KB a sample) ~10% faster 64-128 at a time than 16.
CONV_GRAD_BYTES = 1 << 20


def _per_sample_conv_weight_grads(module: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, out: torch.Tensor) -> None:
    """out (B x Conv2d weight shape) = each sample's weight gradient, the correlation of its input a_i
    (B x C x H x W) with its output gradient g_i (B x O x H' x W'), by one of two batched forms
    (measured on CPU: the first is 1.5-1.7x faster for SimpleCNN's and tct_cnn's 1-channel first
    layers, the second 1.0-3.7x faster for their second layers):

    - C = 1: a convolution of the inputs with the output gradients as filters (batch: the C input
      channels, groups: the samples; stride and dilation swap roles, as in a weight gradient);
    - otherwise: the weight gradient of one convolution whose groups are the samples (input
      1 x (B C) x H x W, weight (B O) x C x kh x kw, groups = B), which stacks the samples' own.
    """
    b, o, h_out, w_out = g.shape
    c = module.in_channels
    kh, kw = module.kernel_size
    if c == 1:
        w = F.conv2d(a.transpose(0, 1), g.reshape(b * o, 1, h_out, w_out), stride=module.dilation,
                     padding=module.padding, dilation=module.stride, groups=b)
        # The correlation can reach past the kernel when the stride leaves input rows unused; they are not weights.
        out.copy_(w[:, :, :kh, :kw].reshape(c, b, o, kh, kw).permute(1, 2, 0, 3, 4))
        return
    per_sample = (a[0].numel() + g[0].numel()) * a.element_size()
    step = max(1, CONV_GRAD_BYTES // per_sample)
    for s in range(0, b, step):
        a_s, g_s = a[s:s + step], g[s:s + step]
        n = a_s.shape[0]
        weight = module.weight.detach().repeat(n, 1, 1, 1)  # only its shape matters for the weight gradient
        w_grad = torch.ops.aten.convolution_backward(
            g_s.reshape(1, n * o, h_out, w_out), a_s.reshape(1, n * c, *a_s.shape[2:]), weight, None,
            module.stride, module.padding, module.dilation, False, [0, 0], n, [False, True, False])[1]
        out[s:s + n].copy_(w_grad.view(n, o, c, kh, kw))


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
