"""Starting a run on a prepared natural federation costs the same however many clients it holds: set-up
makes no per-client object for a client that does not train, builds no per-sample index array, hashes no
partition on one rank, and does not wait for the folder's SHA-256 (the first checkpoint records it; a
resume still refuses changed bytes: tests/integration/test_prepared.py). Work is counted, never timed."""
from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

from conftest import build_trainer
from distfl.data import prepared
from distfl.data.digest import PendingDigest
from distfl.data.natural import Federated
from distfl.data.parts import Parts
from distfl.federation.population import Population
from distfl.federation.run_state import RunRecord

CLIENTS = 5_000


def prepared_trainer(tmp_path):
    """A Trainer (nothing trained) of mclr on a prepared federation of CLIENTS clients, written once."""
    folder = tmp_path / "prepared"
    if not folder.exists():
        rng = np.random.default_rng(0)
        n = 2 * CLIENTS
        fed = Federated(rng.normal(size=(n, 1, 1, 4)).astype(np.float32), rng.integers(0, 3, n),
                        np.arange(CLIENTS + 1, dtype=np.int64) * 2, rng.normal(size=(CLIENTS, 1, 1, 4)).astype(np.float32),
                        rng.integers(0, 3, CLIENTS), np.arange(CLIENTS + 1, dtype=np.int64), 3, "many",
                        client_ids=[f"user{k}" for k in range(CLIENTS)])
        prepared.write_prepared(fed, str(folder), "leaf", "generated")
    return build_trainer(None, tmp_path / "run", "data.dataset=prepared", f"data.path={folder}",
                         "partition.scheme=natural", f"partition.num_clients={CLIENTS}", "model.name=mclr",
                         "train.rounds=2", "train.clients_per_round=10", "train.batch_size=2", "output.progress=none",
                         "output.tensorboard=false")


def test_set_up_makes_nothing_for_a_client_until_it_trains(tmp_path, monkeypatch):
    made, flats, fingerprints = [], [], []
    getitem, flat, fingerprint = Parts.__getitem__, Parts.flat, Population.fingerprint
    monkeypatch.setattr(Parts, "__getitem__", lambda self, k: made.append(k) or getitem(self, k))
    monkeypatch.setattr(Parts, "flat", property(lambda self: flats.append(1) or flat.fget(self)))
    monkeypatch.setattr(Population, "fingerprint", lambda self: fingerprints.append(1) or fingerprint(self))
    trainer = prepared_trainer(tmp_path)
    try:
        assert len(trainer.population) == CLIENTS
        # no client's indices, no array of all samples' indices, no class counts, no partition hash
        assert made == [] and flats == [] and fingerprints == [] and trainer.population._class_counts is None
        assert trainer.population.indices.is_ranges  # held by its offsets alone
        trainer.run_round(1)
        cohort = trainer.population.cohort(trainer.cfg.seed, 1, 10)
        assert sorted(made) == cohort and flats == []  # the round's 10 clients, each made once
        for k in cohort:
            assert np.array_equal(trainer.client_indices[k].numpy(), np.arange(2 * k, 2 * k + 2))
    finally:
        trainer.close()


def test_set_up_does_not_wait_for_the_folders_hash(tmp_path, monkeypatch):
    real, release, niceness = prepared.folder_sha256, threading.Event(), []

    def held(folder):
        niceness.append(os.getpriority(os.PRIO_PROCESS, 0))  # Linux: this thread's own nice value
        release.wait(300)  # a set-up that waited would fail the assertions below, not hang
        return real(folder)

    monkeypatch.setattr(prepared, "folder_sha256", held)
    trainer = prepared_trainer(tmp_path)
    try:
        path, digest = trainer.data.sources["data.path"]
        assert isinstance(digest, PendingDigest) and not digest.done  # set up while the hash is still held
        trainer.run_round(1)
        assert not digest.done
        release.set()
        record = next(p for p in trainer.checkpointed if isinstance(p, RunRecord)).state_dict()
        assert record["data"] == {"data.path": {"path": path, "sha256": real(path)}}  # what a checkpoint holds
        assert type(record["data"]["data.path"]) is dict and digest.done
        if sys.platform.startswith("linux"):  # the hash yields to the training on a busy machine
            assert niceness == [min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)]
    finally:
        release.set()
        trainer.close()


def test_a_failed_hash_is_raised_where_it_is_read():
    digest = PendingDigest(lambda: str(1 // 0))
    with pytest.raises(ZeroDivisionError):
        digest.result()
