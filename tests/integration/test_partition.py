import gzip
import hashlib
import json
import os

import numpy as np
import pytest

from conftest import build_trainer, run_cli, train_ok
from distfl.data.datasets import DEBIAN_FMNIST_DIR
from distfl.data.partition import describe, partition, save_partition
from distfl.errors import DataError
from distfl.config.schema import KEYS, PartitionConfig

SCHEMES = ["iid", "dirichlet", "n_classes", "shards", "quantity"]


def balanced_labels(n_per_class=6000, num_classes=10, seed=1):
    labels = np.repeat(np.arange(num_classes), n_per_class)
    np.random.RandomState(seed).shuffle(labels)
    return labels


LABELS = balanced_labels()  # 60000 labels of 10 classes, like FMNIST


def classes_of(part, labels):
    return set(np.unique(labels[part]).tolist())


def test_covers_every_scheme_in_the_schema():
    # longtail clients may overlap (tests/integration/test_partition_longtail.py), so it is not in the disjoint set;
    # file reads the split as it is (tests/integration/test_plugins.py), natural the dataset's clients
    # (tests/integration/test_fedprox_synthetic.py).
    assert sorted(KEYS["partition.scheme"].choices) == sorted(SCHEMES + ["longtail", "file", "natural"])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_disjoint_cover_int64_and_pure(scheme):
    cfg = PartitionConfig(scheme=scheme, num_clients=10)
    parts = partition(LABELS, cfg, 10, seed=0)
    assert len(parts) == 10
    assert all(p.dtype == np.int64 and len(p) > 0 for p in parts)
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)  # disjoint
    assert np.array_equal(np.sort(joined), np.arange(len(LABELS)))  # covers everything

    again = partition(LABELS.copy(), cfg, 10, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition(LABELS, cfg, 10, seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_client_lists_are_shuffled(scheme):
    parts = partition(LABELS, PartitionConfig(scheme=scheme, num_clients=10), 10, seed=0)
    assert not all(np.all(np.diff(p) > 0) for p in parts)
    if scheme != "iid":  # shards and n_classes are built class by class; the shuffle mixes the classes
        assert any(len(set(LABELS[p[:50]].tolist())) > 1 for p in parts)


def test_iid_sizes_and_labels():
    parts = partition(LABELS, PartitionConfig(scheme="iid", num_clients=7), 10, seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(classes_of(p, LABELS) == set(range(10)) for p in parts)


def test_dirichlet_min_size_and_cap():
    # 20 classes of 3000, 5 clients: N/K = 12000. With alpha=0.1 an uncapped split routinely hands a client
    # several whole classes; the cap stops additions once a client reaches N/K, so no client can exceed N/K
    # by more than one class.
    labels = balanced_labels(3000, 20)
    n, k = len(labels), 5
    for seed in range(10):
        cfg = PartitionConfig(scheme="dirichlet", num_clients=k, alpha=0.1, min_size=10)
        parts = partition(labels, cfg, 20, seed)
        sizes = [len(p) for p in parts]
        assert min(sizes) >= 10
        assert max(sizes) < n / k + 3000


def test_dirichlet_min_size_respected_for_many_clients():
    cfg = PartitionConfig(scheme="dirichlet", num_clients=100, alpha=0.1, min_size=50)
    parts = partition(LABELS, cfg, 10, seed=3)
    assert min(len(p) for p in parts) >= 50


def test_dirichlet_small_alpha_fewer_classes():
    def mean_classes(alpha):
        parts = partition(LABELS, PartitionConfig(scheme="dirichlet", num_clients=10, alpha=alpha), 10, seed=0)
        return np.mean([len(classes_of(p, LABELS)) for p in parts])

    assert mean_classes(0.1) < mean_classes(1.0) < mean_classes(100.0)
    assert mean_classes(100.0) == 10


def test_dirichlet_tiny_alpha_does_not_produce_garbage():
    # Legacy Dirichlet draws with alpha=1e-3 are sometimes NaN; the partition must stay a disjoint cover.
    labels = balanced_labels(500, 100)
    for seed in range(5):
        cfg = PartitionConfig(scheme="dirichlet", num_clients=10, alpha=0.001)
        parts = partition(labels, cfg, 100, seed)
        joined = np.concatenate(parts)
        assert np.array_equal(np.sort(joined), np.arange(len(labels)))
        assert min(len(p) for p in parts) >= 10


def test_dirichlet_impossible_split_raises():
    cfg = PartitionConfig(scheme="dirichlet", num_clients=100, alpha=0.001, min_size=500, max_attempts=3)
    with pytest.raises(DataError, match="alpha=0.001.*min_size=500.*max_attempts=3"):
        partition(LABELS, cfg, 10, seed=0)


def test_too_few_samples_raises_up_front():
    for scheme in ["dirichlet", "quantity"]:
        cfg = PartitionConfig(scheme=scheme, num_clients=100, min_size=10)
        with pytest.raises(DataError, match="min_size=10"):
            partition(LABELS[:999], cfg, 10, seed=0)


def test_n_classes_one_class_each():
    cfg = PartitionConfig(scheme="n_classes", num_clients=10, classes_per_client=1)
    parts = partition(LABELS, cfg, 10, seed=0)
    for i, p in enumerate(parts):
        assert classes_of(p, LABELS) == {i}
        assert len(p) == 6000


def test_n_classes_two_classes_each():
    cfg = PartitionConfig(scheme="n_classes", num_clients=10, classes_per_client=2)
    for seed in range(5):
        parts = partition(LABELS, cfg, 10, seed)
        for i, p in enumerate(parts):
            held = classes_of(p, LABELS)
            assert len(held) == 2 and i in held
        # each class is split evenly among its holders
        for c in range(10):
            counts = [np.sum(LABELS[p] == c) for p in parts if np.any(LABELS[p] == c)]
            assert max(counts) - min(counts) <= 1


def test_n_classes_all_classes_is_an_even_split():
    cfg = PartitionConfig(scheme="n_classes", num_clients=10, classes_per_client=10)
    parts = partition(LABELS, cfg, 10, seed=0)
    for p in parts:
        assert np.array_equal(np.bincount(LABELS[p], minlength=10), np.full(10, 600))


def test_n_classes_too_many_classes_raises():
    cfg = PartitionConfig(scheme="n_classes", num_clients=10, classes_per_client=11)
    with pytest.raises(DataError, match="classes_per_client=11"):
        partition(LABELS, cfg, 10, seed=0)


def test_n_classes_fewer_clients_than_classes_leaves_classes_unused():
    cfg = PartitionConfig(scheme="n_classes", num_clients=3, classes_per_client=1)
    parts = partition(LABELS, cfg, 10, seed=0)
    assert [classes_of(p, LABELS) for p in parts] == [{0}, {1}, {2}]


def test_shards_few_classes_per_client():
    cfg = PartitionConfig(scheme="shards", num_clients=100, shards_per_client=2)
    parts = partition(LABELS, cfg, 10, seed=0)
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(len(LABELS)))
    n_classes = [len(classes_of(p, LABELS)) for p in parts]
    assert max(n_classes) <= 2 * 2
    # 600-sample shards of 6000-sample classes never straddle a class boundary here
    assert all(1 <= c <= 2 for c in n_classes)
    assert all(len(p) == 600 for p in parts)


def test_quantity_sizes_vary_labels_iid():
    cfg = PartitionConfig(scheme="quantity", num_clients=10, alpha=0.5, min_size=10)
    parts = partition(LABELS, cfg, 10, seed=0)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 10
    assert sizes.max() > 2 * sizes.min()
    glob = np.bincount(LABELS, minlength=10) / len(LABELS)
    for p in parts:
        if len(p) >= 2000:
            dist = np.bincount(LABELS[p], minlength=10) / len(p)
            assert np.abs(dist - glob).max() < 0.03


def test_quantity_impossible_raises():
    cfg = PartitionConfig(scheme="quantity", num_clients=50, alpha=0.01, min_size=1000, max_attempts=5)
    with pytest.raises(DataError, match="alpha=0.01.*min_size=1000.*max_attempts=5 attempts; raise partition.max_attempts"):
        partition(LABELS, cfg, 10, seed=0)


def test_quantity_niid_bench_setting_passes_with_the_default_cap():
    # NIID-Bench's iid-diff-quantity at 100 clients, alpha 0.5, min_size 10 on 60,000 samples accepts about
    # one Dirichlet draw in 70,000; seed 16 happens to accept draw 2,475, past the old cap of 1,000.
    cfg = PartitionConfig(scheme="quantity", num_clients=100, alpha=0.5, min_size=10)
    assert cfg.max_attempts == 0  # the scheme's default
    parts = partition(LABELS, cfg, 10, seed=16)
    assert min(len(p) for p in parts) >= 10
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))
    # It takes the first acceptable draw, as NIID-Bench does: exactly 2,475 draws are needed.
    exact = partition(LABELS, PartitionConfig(scheme="quantity", num_clients=100, alpha=0.5, max_attempts=2475), 10, 16)
    assert all(np.array_equal(a, b) for a, b in zip(parts, exact))
    cfg_short = PartitionConfig(scheme="quantity", num_clients=100, alpha=0.5, max_attempts=2474)
    with pytest.raises(DataError, match="max_attempts=2474 attempts; raise partition.max_attempts"):
        partition(LABELS, cfg_short, 10, 16)


def niid_bench_quantity(n, k, alpha, seed, min_size=10):
    """NIID-Bench's iid-diff-quantity loop, one draw at a time, then distfl's shuffle of each client's list."""
    rng = np.random.RandomState(seed)
    idx = rng.permutation(n)
    while True:
        q = rng.dirichlet(np.repeat(alpha, k))
        q = q / q.sum()
        if np.min(q * n) >= min_size:
            break
    parts = np.split(idx, (np.cumsum(q) * n).astype(int)[:-1])
    for part in parts:
        rng.shuffle(part)
    return parts


@pytest.mark.parametrize("k, alpha, seed", [(100, 0.5, 16), (10, 0.1, 3), (10, 1.0, 0), (1, 0.5, 0)])
def test_quantity_batched_draws_equal_one_at_a_time(k, alpha, seed):
    # (100, 0.5, 16) accepts draw 2,475, in the second batch; the rest accept within the first.
    parts = partition(LABELS, PartitionConfig(scheme="quantity", num_clients=k, alpha=alpha), 10, seed)
    expected = niid_bench_quantity(len(LABELS), k, alpha, seed)
    assert len(parts) == k and all(np.array_equal(a, b) for a, b in zip(parts, expected))


def test_resampling_error_names_the_default_cap():
    # Tiny, so 1,000 attempts are quick: alpha 1e-6 gives one client (all but) the whole class, never 15 and 15.
    labels = np.zeros(30, dtype=np.int64)
    cfg = PartitionConfig(scheme="dirichlet", num_clients=2, alpha=1e-6, min_size=15)
    with pytest.raises(DataError, match=r"max_attempts=1000 \(the default\) attempts; raise partition.max_attempts "
                                        r"\(0 = this scheme's default, 1000\)"):
        partition(labels, cfg, 1, seed=0)


def test_empty_client_raises():
    labels = np.arange(10) % 10
    cfg = PartitionConfig(scheme="shards", num_clients=8, shards_per_client=2)  # 16 shards of 10 samples
    with pytest.raises(DataError, match="client .* no samples"):
        partition(labels, cfg, 10, seed=0)


def test_bad_labels_raise():
    with pytest.raises(DataError):
        partition(np.array([0, 1, 10]), PartitionConfig(scheme="iid", num_clients=1), 10, seed=0)


# NIID-Bench's own client sets on the real FMNIST training labels; tests/fixtures/README.md says how they were made.
FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "niid_bench_fmnist.json")
FMNIST_TRAIN_LABELS = os.path.join(DEBIAN_FMNIST_DIR, "train-labels-idx1-ubyte.gz")
with open(FIXTURE) as _f:
    NIID_BENCH_CASES = json.load(_f)["cases"]


def niid_bench_config(case):
    """The distfl partition config of one NIID-Bench fixture case."""
    name, k = case["niid_bench_partition"], case["n_parties"]
    if name == "homo":
        return PartitionConfig(scheme="iid", num_clients=k)
    if name == "noniid-labeldir":
        return PartitionConfig(scheme="dirichlet", num_clients=k, alpha=case["beta"])
    assert name.startswith("noniid-#label"), name
    return PartitionConfig(scheme="n_classes", num_clients=k, classes_per_client=int(name[len("noniid-#label"):]))


@pytest.fixture(scope="module")
def fmnist_train_labels():
    if not os.path.exists(FMNIST_TRAIN_LABELS):
        pytest.skip(f"real Fashion-MNIST labels not installed ({FMNIST_TRAIN_LABELS})")
    with gzip.open(FMNIST_TRAIN_LABELS, "rb") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8).astype(np.int64)  # IDX1: 8-byte header
    assert len(labels) == 60000
    return labels


def test_niid_bench_fixture_covers_every_scheme():
    names = {c["niid_bench_partition"] for c in NIID_BENCH_CASES}
    assert {"homo", "noniid-labeldir", "noniid-#label1", "noniid-#label2", "noniid-#label3"} <= names
    assert len(NIID_BENCH_CASES) == 34


@pytest.mark.parametrize(
    "case", NIID_BENCH_CASES,
    ids=[f"{c['niid_bench_partition']}-{c['n_parties']}-beta{c['beta']}-seed{c['seed']}" for c in NIID_BENCH_CASES])
def test_reproduces_niid_bench_client_sets(case, fmnist_train_labels):
    # Exact client index sets (orders differ: NIID-Bench shuffles only its Dirichlet clients' lists).
    parts = partition(fmnist_train_labels, niid_bench_config(case), 10, case["seed"])
    assert [len(p) for p in parts] == case["client_sizes"]
    digests = [hashlib.sha256(np.sort(p).astype(np.int64).tobytes()).hexdigest() for p in parts]
    assert digests == case["client_sha256_sorted_int64"]


def test_describe_matches_parts():
    cfg = PartitionConfig(scheme="dirichlet", num_clients=10, alpha=0.5)
    parts = partition(LABELS, cfg, 10, seed=0)
    text = describe(parts, LABELS, 10)
    lines = text.splitlines()
    assert len(lines) == 1 + 10 + 1
    for i, p in enumerate(parts):
        fields = lines[1 + i].replace("|", " ").split()
        assert int(fields[0]) == i and int(fields[1]) == len(p)
        assert [int(v) for v in fields[3:]] == np.bincount(LABELS[p], minlength=10).tolist()
    sizes = sorted(len(p) for p in parts)
    assert f"{sizes[0]}/" in lines[-1] and f"/{sizes[-1]}" in lines[-1]


def test_describe_many_classes_shows_top5():
    labels = balanced_labels(100, 100)
    parts = partition(labels, PartitionConfig(scheme="iid", num_clients=100), 100, seed=0)
    lines = describe(parts, labels, 100).splitlines()
    assert len(lines) == 1 + 100 + 1
    row = lines[1]
    top = row.split("|")[1].split()
    assert len(top) == 5
    hist = np.bincount(labels[parts[0]], minlength=100)
    c, n = top[0].split(":")
    assert hist[int(c)] == int(n) == hist.max()


def test_partition_cli_writes_the_split_training_uses(small_config, tmp_path):
    out = tmp_path / "sub" / "split.npz"
    overrides = ["partition.scheme=n_classes", "partition.num_clients=7"]
    proc = run_cli(["partition", small_config, "--out", out, *overrides])
    assert proc.returncode == 0, proc.stderr
    assert f"to {out}" in proc.stdout

    with np.load(out) as saved:
        assert sorted(saved.files) == sorted(f"client_{i}" for i in range(7))
        arrays = [saved[f"client_{i}"] for i in range(7)]
    assert all(a.dtype == np.int64 for a in arrays)
    trainer = build_trainer(small_config, tmp_path / "run", *overrides)
    used = trainer.population.indices
    assert len(used) == 7
    assert all(np.array_equal(a, u) for a, u in zip(arrays, used))  # same indices, same order
    assert np.array_equal(np.sort(np.concatenate(arrays)), np.arange(len(trainer.data.train_y)))

    # Reused through partition.scheme=file, the saved split trains the very same model.
    short = ["train.rounds=2", "checkpoint.every=0"]
    direct = train_ok(small_config, *overrides, *short, f"output.dir={tmp_path / 'direct'}")
    reused = train_ok(small_config, "partition.scheme=file", f"partition.path={out}", "partition.num_clients=7",
                      *short, f"output.dir={tmp_path / 'reused'}")
    assert reused["model_sha256"] == direct["model_sha256"]


def test_partition_seed_holds_the_split_while_the_run_seed_varies(small_config, tmp_path):
    """partition.seed draws the data (synthetic set, split) as `seed` would, and training with another
    `seed` on it is a run on that saved split: the same model, bit for bit. The run's seed still sets
    the rest (initial model, batches)."""
    def split(name, *overrides):
        out = tmp_path / f"{name}.npz"
        proc = run_cli(["partition", small_config, "--out", out, *overrides])
        assert proc.returncode == 0, proc.stderr
        with np.load(out) as saved:
            return out, [saved[f"client_{i}"] for i in range(len(saved.files))]

    seed0, parts0 = split("seed0", "seed=0")
    _, held = split("held", "seed=5", "partition.seed=0")
    _, own = split("own", "seed=5")
    assert all(np.array_equal(a, b) for a, b in zip(parts0, held))
    assert not all(np.array_equal(a, b) for a, b in zip(parts0, own))

    short = ["train.rounds=2", "checkpoint.every=0"]
    held_run = train_ok(small_config, "seed=1", "partition.seed=0", *short, f"output.dir={tmp_path / 'held'}")
    # (partition.seed=0 here too: the small config's data is synthetic, drawn from the data's seed)
    on_file = train_ok(small_config, "seed=1", "partition.seed=0", "partition.scheme=file", f"partition.path={seed0}",
                       f"partition.num_clients={len(parts0)}", *short, f"output.dir={tmp_path / 'file'}")
    assert held_run["model_sha256"] == on_file["model_sha256"]
    seed0_run = train_ok(small_config, "seed=0", *short, f"output.dir={tmp_path / 'seed0'}")
    assert seed0_run["model_sha256"] != held_run["model_sha256"]


def test_partition_cli_rejects_a_bad_out_before_any_work(small_config, tmp_path):
    proc = run_cli(["partition", small_config, "--out", tmp_path / "split.txt"])
    assert proc.returncode == 2
    assert "--out" in proc.stderr and ".npz" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == "" and list(tmp_path.iterdir()) == [small_config]
    (tmp_path / "dir.npz").mkdir()
    proc = run_cli(["partition", small_config, "--out", tmp_path / "dir.npz"])
    assert proc.returncode == 2 and "is a directory" in proc.stderr and proc.stdout == ""


def test_save_partition_leaves_nothing_half_written(tmp_path, monkeypatch):
    def fail_midway(f, **arrays):
        f.write(b"PK partial")
        raise OSError("disk full")

    out = tmp_path / "split.npz"
    monkeypatch.setattr(np, "savez", fail_midway)
    with pytest.raises(OSError, match="disk full"):
        save_partition([np.arange(3)], str(out))
    assert list(tmp_path.iterdir()) == []
