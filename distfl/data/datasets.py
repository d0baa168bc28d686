"""Datasets as whole in-memory tensors: Fashion-MNIST, CIFAR-10/100, your own files (an .npz or ImageFolder
trees), and a small synthetic set for tests.

Batches are index slices of these tensors (no DataLoader on the hot path); train-time augmentation is a
batched function applied to such a slice.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from distfl.checkpoint import file_sha256
from distfl.data.fedprox_synthetic import load_fedprox_synthetic
from distfl.data.leaf import load_leaf
from distfl.data.natural import Federated
from distfl.data.npz import npz_errors
from distfl.data.prepared import load_prepared
from distfl.data.tff_text import load_tff_folder
from distfl.data.tokens import TokenTask
from distfl.errors import DataError
from distfl.config.schema import DataConfig

# Where the Debian/Ubuntu package `dataset-fashion-mnist` installs the IDX files (tests monkeypatch it).
DEBIAN_FMNIST_DIR = "/usr/share/datasets/fashion-mnist"

FMNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)

CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


@dataclass
class Dataset:
    train_x: torch.Tensor  # float32 N x C x H x W
    train_y: torch.Tensor  # int64 N
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    name: str
    augment: Callable[[torch.Tensor], torch.Tensor] | None  # batched train-time augmentation, or None
    # The per-channel (mean, std) subtracted from and divided into both splits, or None for none.
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    # What the data were read from: role ("data.path", "train-images-idx3-ubyte", ...) -> (path, SHA-256
    # of the bytes read, or a data/digest.PendingDigest still computing it); a resumed run refuses data whose
    # bytes changed since it started. {} when synthetic.
    sources: dict[str, tuple] = field(default_factory=dict)
    # A natural federation's clients (distfl/data/natural.py), else None: client k's training samples are
    # train_x[train_offsets[k]:train_offsets[k + 1]], its own test samples test_x[test_offsets[k]:...].
    train_offsets: np.ndarray | None = None
    test_offsets: np.ndarray | None = None
    # A next-token dataset's special tokens (data/tokens.py), else None: then x and y are int64 N x L
    # (inputs, and the token following each position) and it is scored per token.
    tokens: TokenTask | None = None
    # Word vectors V x D (float32) that the int64 token ids of x index (Sent140's embs.json), else None: a model
    # that embeds with them (sent140_lstm) receives them at build; they are data, hashed in `sources`.
    embeddings: torch.Tensor | None = None
    # A natural federation's names of its clients, in order (LEAF's users, TFF's client ids), else None
    client_ids: object = None

    @property
    def input_shape(self) -> tuple:
        return tuple(self.train_x.shape[1:])

    def to(self, device) -> "Dataset":
        return replace(
            self,
            train_x=self.train_x.to(device),
            train_y=self.train_y.to(device),
            test_x=self.test_x.to(device),
            test_y=self.test_y.to(device),
        )


def load_dataset(cfg: DataConfig, seed: int) -> Dataset:
    """Load the dataset named by `cfg.dataset` on CPU. `seed` only matters for the synthetic set."""
    if cfg.dataset == "fmnist":
        ds = _load_fmnist(cfg)
    elif cfg.dataset in ("cifar10", "cifar100"):
        ds = _load_cifar(cfg)
    elif cfg.dataset == "synthetic":
        ds = _make_synthetic(cfg, seed)
    elif cfg.dataset == "files":
        ds = _load_files(cfg.path)
    elif cfg.dataset == "fedprox_synthetic":
        ds = from_federated(load_fedprox_synthetic(cfg.synthetic_alpha, cfg.synthetic_beta, cfg.synthetic_iid, seed))
    elif cfg.dataset == "leaf":
        ds = from_federated(load_leaf(cfg.path, cfg.leaf_split, seed, cfg.embeddings, cfg.vocabulary))
    elif cfg.dataset == "tff":
        ds = from_federated(load_tff_folder(cfg.path, cfg.sequence_length, cfg.oov_buckets))
    elif cfg.dataset == "prepared":
        ds = from_federated(load_prepared(cfg.path))
    else:
        raise DataError(f"unknown data.dataset {cfg.dataset!r}; valid: fmnist, cifar10, cifar100, synthetic, files, "
                        "fedprox_synthetic, leaf, tff, prepared")

    if not ds.train_x.is_floating_point() and (cfg.normalize == "mean_std" or cfg.augment == "crop_flip"):
        key = "data.normalize=mean_std" if cfg.normalize == "mean_std" else "data.augment=crop_flip"
        raise DataError(f"{key} scales or crops images, but {ds.name}'s inputs are token indices "
                        f"({ds.train_x.dtype}); use data.normalize=none and data.augment=none")
    if cfg.normalize == "mean_std":
        ds = normalized(ds, *training_mean_std(ds.train_x))
    elif cfg.normalize == "auto" and cfg.dataset in CIFAR_STATS:
        ds = normalized(ds, *CIFAR_STATS[cfg.dataset])
    elif cfg.normalize not in ("auto", "none"):
        raise DataError(f"unknown data.normalize {cfg.normalize!r}; valid: auto, none, mean_std")

    if cfg.augment == "crop_flip" or (cfg.augment == "auto" and cfg.dataset in ("cifar10", "cifar100")):
        ds.augment = random_crop_flip
    elif cfg.augment not in ("auto", "none"):
        raise DataError(f"unknown data.augment {cfg.augment!r}; valid: auto, none, crop_flip")
    return ds


def training_mean_std(train_x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) standard deviation of the training inputs, computed in float64."""
    means, stds = [], []
    for c in range(train_x.shape[1]):
        values = train_x[:, c].double()  # one channel at a time: float64 CIFAR at once would be 1.2 GB
        mean = values.mean()
        std = (values - mean).square().mean().sqrt()
        if std.item() == 0:
            raise DataError(f"data.normalize=mean_std: channel {c} of the training inputs is constant "
                            f"({mean.item():.6g}), so it has no standard deviation to divide by")
        means.append(mean.item())
        stds.append(std.item())
    return tuple(means), tuple(stds)


def normalized(ds: Dataset, mean, std) -> Dataset:
    """`ds` with (x - mean) / std per channel on both splits (float32 arithmetic)."""
    shape = (1, len(mean)) + (1,) * (ds.train_x.dim() - 2)
    mean_t, std_t = (torch.tensor(v, dtype=torch.float32).view(shape) for v in (mean, std))
    return replace(
        ds,
        train_x=((ds.train_x - mean_t) / std_t).contiguous(),
        test_x=((ds.test_x - mean_t) / std_t).contiguous(),
        normalization=(tuple(mean), tuple(std)),
    )


def random_crop_flip(x: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """Random crop (after reflect padding, as NIID-Bench does for CIFAR-10) and random horizontal flip.

    Batched: one crop offset and one flip per sample, drawn from the global torch RNG on x's device.
    """
    n, c, h, w = x.shape
    if padding > 0:
        x = F.pad(x, (padding, padding, padding, padding), mode="reflect")
    dev = x.device
    oy = torch.randint(0, 2 * padding + 1, (n,), device=dev)
    ox = torch.randint(0, 2 * padding + 1, (n,), device=dev)
    rows = (oy[:, None] + torch.arange(h, device=dev))[:, None, :, None]  # n x 1 x h x 1
    cols = (ox[:, None] + torch.arange(w, device=dev))[:, None, None, :]  # n x 1 x 1 x w
    crops = x[
        torch.arange(n, device=dev)[:, None, None, None],
        torch.arange(c, device=dev)[None, :, None, None],
        rows,
        cols,
    ]
    flip = torch.rand(n, device=dev) < 0.5
    return torch.where(flip[:, None, None, None], crops.flip(3), crops)


def from_federated(fed: Federated) -> Dataset:
    """A natural federation (distfl/data/natural.py) as a Dataset whose offsets keep its clients."""
    return Dataset(torch.from_numpy(fed.train_x), torch.from_numpy(fed.train_y), torch.from_numpy(fed.test_x),
                   torch.from_numpy(fed.test_y), fed.num_classes, name=fed.name, augment=None, sources=fed.sources,
                   train_offsets=fed.train_offsets, test_offsets=fed.test_offsets, tokens=fed.tokens,
                   embeddings=None if fed.embeddings is None else torch.from_numpy(np.asarray(fed.embeddings)),
                   client_ids=fed.client_ids if len(fed.client_ids) else None)


# ---------------------------------------------------------------- Fashion-MNIST


def _fmnist_file(directory: str, name: str) -> str | None:
    """The path of `name` in `directory`, gzipped or not, or None."""
    for candidate in (name, name[: -len(".gz")]):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    return None


def _holds_fmnist(directory: str) -> bool:
    return all(_fmnist_file(directory, name) is not None for name in FMNIST_FILES)


def _fmnist_missing_message(root: str, tried: list[str], why: str) -> str:
    names = ", ".join(FMNIST_FILES)
    return (
        f"Fashion-MNIST not found: looked for {names} (gzipped or not) in {', '.join(tried)}. {why} "
        f"To get the data, either install the Debian/Ubuntu package (`apt-get install dataset-fashion-mnist`, "
        f"which puts the files in {DEBIAN_FMNIST_DIR}), or put the four files in data.root (now {root!r}), "
        f"or allow a download with data.download=true on a machine with network access."
    )


def find_fmnist(root: str, download: bool = False) -> str:
    """The directory holding the four Fashion-MNIST IDX files.

    Looks in `root`, then `root/FashionMNIST/raw` (torchvision's layout), then the Debian package's folder;
    with `download`, finally tries a torchvision download into `root`. Raises DataError if all fail.
    """
    torchvision_dir = os.path.join(root, "FashionMNIST", "raw")
    tried = [root, torchvision_dir, DEBIAN_FMNIST_DIR]
    for directory in tried:
        if _holds_fmnist(directory):
            return directory

    if not download:
        raise DataError(_fmnist_missing_message(root, tried, "No download was tried (data.download=false)."))
    try:
        from torchvision.datasets import FashionMNIST

        # torchvision prints a line per failed mirror; the error below says what matters.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            FashionMNIST(root, train=True, download=True)
    except Exception as e:  # offline: URLError, RuntimeError, OSError, ...
        reason = _last_line(str(e)) or type(e).__name__
        raise DataError(_fmnist_missing_message(root, tried, f"The download failed ({reason}).")) from None
    if _holds_fmnist(torchvision_dir):
        return torchvision_dir
    raise DataError(_fmnist_missing_message(root, tried, "The download finished but the files are not there."))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _read_idx(path: str, magic: int, item_shape: tuple, sources: dict | None = None) -> np.ndarray:
    """Read an IDX file (gzipped or not) of unsigned bytes, checking its magic number and size; records
    the SHA-256 of its (decompressed) bytes in `sources`."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read {path}: {e} (the file is truncated or corrupt; replace it)") from None

    ndim = 1 + len(item_shape)
    header_size = 4 * (1 + ndim)
    if len(raw) < header_size:
        raise DataError(f"{path} is too short to be an IDX file (truncated or corrupt; replace it)")
    header = np.frombuffer(raw, dtype=">u4", count=1 + ndim)
    if int(header[0]) != magic:
        raise DataError(f"{path}: bad IDX magic number {int(header[0]):#010x}, expected {magic:#010x}")
    count, dims = int(header[1]), tuple(int(d) for d in header[2:])
    if dims != item_shape:
        raise DataError(f"{path}: items have shape {dims}, expected {item_shape}")
    expected = count * int(np.prod(item_shape, dtype=np.int64))
    if len(raw) - header_size != expected:
        raise DataError(
            f"{path}: header says {count} items ({expected} bytes) but the file holds "
            f"{len(raw) - header_size} bytes of data (truncated or corrupt; replace it)"
        )
    if sources is not None:
        role = os.path.basename(path).removesuffix(".gz")
        sources[role] = (path, hashlib.sha256(raw).hexdigest())
    return np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape((count,) + item_shape)


def _read_fmnist_split(directory: str, prefix: str, sources: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    images_path = _fmnist_file(directory, f"{prefix}-images-idx3-ubyte.gz")
    labels_path = _fmnist_file(directory, f"{prefix}-labels-idx1-ubyte.gz")
    images = _read_idx(images_path, 0x00000803, (28, 28), sources)
    labels = _read_idx(labels_path, 0x00000801, (), sources)
    if len(images) != len(labels):
        raise DataError(f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels")
    if labels.max(initial=0) > 9:
        raise DataError(f"{labels_path}: labels must be 0..9, found {int(labels.max())}")
    # ToTensor only, as NIID-Bench does for FMNIST.
    x = torch.from_numpy(images.copy()).unsqueeze(1).float().div_(255.0)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def _load_fmnist(cfg: DataConfig) -> Dataset:
    directory = find_fmnist(cfg.root, download=cfg.download)
    sources = {}
    train_x, train_y = _read_fmnist_split(directory, "train", sources)
    test_x, test_y = _read_fmnist_split(directory, "t10k", sources)
    return Dataset(train_x, train_y, test_x, test_y, num_classes=10, name="fmnist", augment=None, sources=sources)


# ---------------------------------------------------------------- CIFAR


def _load_cifar(cfg: DataConfig) -> Dataset:
    try:
        from torchvision.datasets import CIFAR10, CIFAR100

        cls = CIFAR10 if cfg.dataset == "cifar10" else CIFAR100
        train = cls(cfg.root, train=True, download=cfg.download)
        test = cls(cfg.root, train=False, download=cfg.download)
    except Exception as e:  # offline download (URLError), missing files without download (RuntimeError), ...
        reason = _last_line(str(e)) or type(e).__name__
        how = "the download failed" if cfg.download else "no download was tried (data.download=false)"
        raise DataError(
            f"{cfg.dataset} not found in data.root ({cfg.root!r}) and {how}: {reason}. Either run once with "
            f"data.download=true on a machine with network access, or copy the extracted "
            f"'{CIFAR_FOLDERS[cfg.dataset]}' folder (from the torchvision download) into data.root."
        ) from None

    def convert(split):  # [0, 1]; load_dataset applies data.normalize
        x = torch.from_numpy(split.data).permute(0, 3, 1, 2).float().div_(255.0)
        return x, torch.tensor(split.targets, dtype=torch.int64)

    train_x, train_y = convert(train)
    test_x, test_y = convert(test)
    num_classes = 10 if cfg.dataset == "cifar10" else 100
    folder = os.path.join(cfg.root, CIFAR_FOLDERS[cfg.dataset])
    return Dataset(train_x, train_y, test_x, test_y, num_classes, name=cfg.dataset, augment=None,
                   sources={"data.root": (folder, tree_sha256(folder))})


# ---------------------------------------------------------------- synthetic

# Class means are a shared base image plus this fraction of a class-specific image, so classes overlap under
# the noise: learnable, but not trivially separable.
_SYNTHETIC_CLASS_WEIGHT = 0.35
_SYNTHETIC_NOISE_STD = 0.3


def _make_synthetic(cfg: DataConfig, seed: int) -> Dataset:
    """Gaussian classes around random mean images in [0,1]; a pure function of (cfg, seed)."""
    if cfg.synthetic_classes < 2 or cfg.synthetic_train < 1 or cfg.synthetic_test < 1:
        raise DataError("synthetic data needs synthetic_classes >= 2 and synthetic_train, synthetic_test >= 1")
    g = torch.Generator().manual_seed(seed)
    shape = (cfg.synthetic_channels, cfg.synthetic_image_size, cfg.synthetic_image_size)
    base = torch.rand(shape, generator=g)
    own = torch.rand((cfg.synthetic_classes,) + shape, generator=g)
    means = (1 - _SYNTHETIC_CLASS_WEIGHT) * base + _SYNTHETIC_CLASS_WEIGHT * own

    def sample(n):
        y = torch.randint(0, cfg.synthetic_classes, (n,), generator=g)
        x = means[y] + _SYNTHETIC_NOISE_STD * torch.randn((n,) + shape, generator=g)
        return x, y

    train_x, train_y = sample(cfg.synthetic_train)
    test_x, test_y = sample(cfg.synthetic_test)
    return Dataset(train_x, train_y, test_x, test_y, cfg.synthetic_classes, name="synthetic", augment=None)


# ---------------------------------------------------------------- your own files

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
# An optional scalar in the npz: the class count, for a dataset some of whose classes have no training sample.
NPZ_NUM_CLASSES = "num_classes"


def tree_sha256(root: str) -> str:
    """One SHA-256 over every file under `root`: each relative path and its bytes, in sorted order."""
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0" + file_sha256(path).encode())
    return digest.hexdigest()


def _load_files(path: str) -> Dataset:
    """`data.dataset: files`: an .npz of NPZ_KEYS, or a folder with `train/` and `test/` ImageFolder trees.

    Refused before any work, each with one line: inputs that are not finite, channels-last images,
    inputs and labels of different lengths, and labels that are not the classes 0..K-1 of the training
    set (K = the largest training label + 1, every class with a training sample, unless the npz
    declares `num_classes`), or test labels no training sample has."""
    if os.path.isdir(path):
        (train_x, train_y), (test_x, test_y), names = _read_image_folders(path)
        declared, source = None, tree_sha256(path)
    else:
        train_x, train_y, test_x, test_y, declared, source = _read_npz(path)
        names = None
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(f"data.path {path}: training inputs have shape {tuple(train_x.shape[1:])} but test inputs "
                        f"{tuple(test_x.shape[1:])}")
    num_classes = _check_labels(path, train_y.numpy(), test_y.numpy(), declared, names)
    return Dataset(train_x, train_y, test_x, test_y, num_classes, name="files", augment=None,
                   sources={"data.path": (path, source)})


def _read_npz(path: str):
    with npz_errors("data.path", path):
        with open(path, "rb") as f:
            raw = f.read()
        with np.load(io.BytesIO(raw), allow_pickle=False) as f:
            missing = [k for k in NPZ_KEYS if k not in f.files]
            if missing:
                raise DataError(f"data.path {path} lacks {', '.join(missing)}; it needs {', '.join(NPZ_KEYS)} "
                                f"(it holds {', '.join(f.files) or 'nothing'})")
            arrays = {k: f[k] for k in NPZ_KEYS + ((NPZ_NUM_CLASSES,) if NPZ_NUM_CLASSES in f.files else ())}
    declared = None
    if NPZ_NUM_CLASSES in arrays:
        value = arrays[NPZ_NUM_CLASSES]
        if value.shape != () or not np.issubdtype(value.dtype, np.integer) or int(value) < 2:
            raise DataError(f"data.path {path}: num_classes must be one integer >= 2 (np.savez(..., num_classes=10)), "
                            f"got shape {value.shape} of {value.dtype}")
        declared = int(value)
    out = []
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        where = f"data.path {path}: x_{split}"
        if x.ndim not in (2, 4) or len(x) == 0:
            raise DataError(f"{where} must be non-empty images N x C x H x W or vectors N x D, got shape {x.shape}")
        if x.ndim == 4 and x.shape[3] in (1, 3, 4) and x.shape[1] > 4:  # 1, 3 or 4 channels, last
            raise DataError(f"{where} has shape {x.shape}, which looks like N x H x W x C (channels last); distfl "
                            f"expects images as N x C x H x W: save x_{split}.transpose(0, 3, 1, 2)")
        if x.dtype == np.uint8:
            x = x.astype(np.float32) / 255.0
        elif not np.issubdtype(x.dtype, np.floating):
            raise DataError(f"{where} must be float or uint8 (scaled by 1/255), got {x.dtype}")
        with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, refused next
            x = np.ascontiguousarray(x, dtype=np.float32)
        bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if bad.any():
            raise DataError(f"{where} holds NaN or inf (beyond float32) in {int(bad.sum())} of its {len(x)} samples "
                            f"(the first is sample {int(np.argmax(bad))}); distfl trains only on finite inputs: "
                            "fix or drop those samples")
        if y.ndim != 1 or len(y) != len(x):
            raise DataError(f"data.path {path}: x_{split} holds {len(x)} samples but y_{split} has shape {y.shape}; "
                            f"they must pair one to one ({len(x)} labels for {len(x)} samples)")
        if not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"data.path {path}: y_{split} must hold integer class labels, got {y.dtype}")
        if x.ndim == 2:  # vectors: one "image" of 1 x 1 x D, which the MLP and plugin models flatten
            x = x[:, None, None, :]
        out += [torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))]
    return (*out, declared, hashlib.sha256(raw).hexdigest())


def _check_labels(path: str, train: np.ndarray, test: np.ndarray, declared: int | None, names) -> int:
    """The class count K of a files dataset; DataError unless its labels are classes 0..K-1 (see _load_files)."""
    where = f"data.path {path}"

    def name(label) -> str:
        return f"{label} ({names[label]})" if names is not None and 0 <= label < len(names) else str(label)

    for split, y in (("y_train", train), ("y_test", test)):
        if y.min() < 0:
            first = int(np.argmax(y < 0))
            raise DataError(f"{where}: {split} holds the negative label {int(y[first])} (sample {first}); labels are "
                            "class numbers 0..K-1")
    if declared is not None:
        for split, y in (("y_train", train), ("y_test", test)):
            if y.max() >= declared:
                first = int(np.argmax(y >= declared))
                raise DataError(f"{where}: {split} holds label {int(y[first])} (sample {first}), but the file declares "
                                f"num_classes={declared}: labels must lie in 0..{declared - 1}")
        classes = declared
    else:
        # From the distinct labels, never an array of one count per class: a stray label 2^40 would
        # ask for terabytes before the message below could name it.
        classes = int(train.max()) + 1
        seen = np.unique(train)
        if len(seen) < classes:
            top = classes - 1
            gaps = np.flatnonzero(seen != np.arange(len(seen)))
            first_empty = int(gaps[0]) if len(gaps) else len(seen)
            raise DataError(f"{where}: y_train's labels run up to {top} (sample {int(np.argmax(train == top))}), but "
                            f"{classes - len(seen)} of the classes 0..{top} have no training sample (the first is {first_empty}); "
                            "number the classes 0..K-1 without gaps, or, if some classes truly have no training sample, "
                            "declare their count in the npz (np.savez(..., num_classes=K))")
    unseen = ~np.isin(test, np.unique(train))
    if unseen.any():
        first = int(np.argmax(unseen))
        raise DataError(f"{where}: y_test holds label {name(int(test[first]))} (sample {first}; {int(unseen.sum())} test "
                        "samples in all) that no y_train sample has; the model cannot learn a class it never sees: "
                        "drop those test samples or add training samples of the class")
    return classes


def _read_image_folders(path: str):
    """The train/ and test/ ImageFolder trees; test classes are matched to train's by folder name."""
    train_x, train_y, train_names = _read_image_folder(os.path.join(path, "train"))
    test_x, test_y, test_names = _read_image_folder(os.path.join(path, "test"))
    unknown = [n for n in test_names if n not in train_names]
    if unknown:
        raise DataError(f"data.path {path}: test/ has class folder(s) {', '.join(unknown)} that train/ lacks; the model "
                        "cannot learn a class it never sees: remove them from test/ or add them to train/")
    index = torch.tensor([train_names.index(n) for n in test_names], dtype=torch.int64)
    return (train_x, train_y), (test_x, index[test_y]), train_names


def _read_image_folder(root: str):
    """All images of a torchvision ImageFolder tree (one subfolder per class), as one tensor, and the class names."""
    from torchvision.datasets import ImageFolder
    from torchvision.transforms.functional import to_tensor

    try:
        folder = ImageFolder(root)
    except (OSError, FileNotFoundError) as e:
        raise DataError(f"data.path: {root} is not an ImageFolder tree (one subfolder per class): {e}") from None
    images = [to_tensor(folder.loader(p)) for p, _ in folder.samples]
    if len({tuple(x.shape) for x in images}) != 1:
        raise DataError(f"data.path: the images in {root} differ in size or channels; resize them to one shape")
    return torch.stack(images), torch.tensor(folder.targets, dtype=torch.int64), list(folder.classes)
