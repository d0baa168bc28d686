"""`distfl data prepare tff` streams TFF's text federations client by client into the prepared folder:
every file it writes has the bytes of preparing the federation whole in memory (load_tff_folder, then
write_prepared), on files written in TFF's layout with users in both files, training users without test
sentences, test-only users, fixed-length strings, other sequence lengths and several OOV buckets; and
it refuses what the in-memory reader refuses, leaving nothing behind."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from distfl.data.prepared import ARRAYS, load_prepared, write_prepared
from distfl.data.tff_text import load_tff_folder
from distfl.errors import DataError
from test_tff_text import _shakespeare, _stackoverflow, _write_h5


def _many_users(root: Path) -> None:
    """StackOverflow-shaped: 40 users with 0-6 test sentences, 5 test-only users, unknown words."""
    _stackoverflow(root)
    rng = np.random.default_rng(1)
    words = ["the", "to", ".", "a", "w17", "w9999", "zebra", "yak", "okapi", "naïve"]

    def sentences(n):
        return [" ".join(rng.choice(words, rng.integers(1, 35))) for _ in range(n)]

    train = {f"{k:05d}": sentences(int(rng.integers(1, 9))) for k in range(40)}
    test = {f"{k:05d}": sentences(int(rng.integers(1, 7))) for k in range(0, 40, 3)}
    test.update({f"{k:05d}": sentences(2) for k in range(90, 95)})  # users with no training sentence
    _write_h5(root / "stackoverflow_train.h5", train, "tokens")
    _write_h5(root / "stackoverflow_test.h5", test, "tokens")


def _assert_same_bytes(tmp_path: Path, source: Path, *flags: str) -> None:
    streamed = tmp_path / "streamed"
    proc = run_cli(["data", "prepare", "tff", "--from", str(source), "--out", str(streamed), *flags])
    assert proc.returncode == 0, proc.stderr
    settings = [int(v) for v in flags[1::2]] + [0] * (2 - len(flags) // 2)
    whole = tmp_path / "whole"
    write_prepared(load_tff_folder(str(source), *settings), str(whole), "tff", str(source))
    for name in ("meta.json",) + tuple(f"{a}.npy" for a in ARRAYS):
        assert (streamed / name).read_bytes() == (whole / name).read_bytes(), name
    fed = load_prepared(str(streamed))
    assert fed.test_offsets[-1] < len(fed.test_y)  # test-only users were there, after the clients' own


@pytest.mark.parametrize("flags", [(), ("--sequence-length", "9", "--oov-buckets", "5")])
def test_streamed_stackoverflow_has_the_bytes_of_the_whole(tmp_path, flags):
    (tmp_path / "so").mkdir()
    _many_users(tmp_path / "so")
    _assert_same_bytes(tmp_path, tmp_path / "so", *flags)


@pytest.mark.parametrize("fixed, flags", [(False, ()), (True, ("--sequence-length", "13"))])
def test_streamed_shakespeare_has_the_bytes_of_the_whole(tmp_path, fixed, flags):
    (tmp_path / "sh").mkdir()
    _shakespeare(tmp_path / "sh", fixed)
    with_test_only = {"ZZ_ONLY_IN_TEST": ["to be", "or not"]}
    import h5py

    with h5py.File(tmp_path / "sh" / "shakespeare_test.h5", "a") as f:
        for client, texts in with_test_only.items():
            f["examples"].create_group(client).create_dataset("snippets", data=texts, dtype=h5py.string_dtype())
    _assert_same_bytes(tmp_path, tmp_path / "sh", *flags)


@pytest.mark.parametrize("damage, message", [
    (lambda root: _write_h5(root / "stackoverflow_train.h5", {"1": ["a b"], "2": []}, "tokens"),
     "client '2' has no training sample"),
    (lambda root: _write_h5(root / "stackoverflow_test.h5", {}, "tokens"), "'examples' holds no client"),
    (lambda root: _write_h5(root / "stackoverflow_test.h5", {"1": ["a"]}, "title"), "client '1' lacks tokens"),
])
def test_streaming_refuses_what_the_whole_reader_refuses(tmp_path, damage, message):
    (tmp_path / "so").mkdir()
    _stackoverflow(tmp_path / "so")
    damage(tmp_path / "so")
    with pytest.raises(DataError, match=message):
        load_tff_folder(str(tmp_path / "so"))
    proc = run_cli(["data", "prepare", "tff", "--from", str(tmp_path / "so"), "--out", str(tmp_path / "out")])
    assert proc.returncode != 0 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["so"]  # no folder, no temporary one


def test_numbers_where_sentences_belong_are_refused_before_writing(tmp_path):
    (tmp_path / "so").mkdir()
    _stackoverflow(tmp_path / "so")
    import h5py

    with h5py.File(tmp_path / "so" / "stackoverflow_test.h5", "a") as f:
        f["examples"].create_group("77777").create_dataset("tokens", data=np.arange(3))
    proc = run_cli(["data", "prepare", "tff", "--from", str(tmp_path / "so"), "--out", str(tmp_path / "out")])
    assert proc.returncode != 0 and "tokens must be a 1-D array of strings" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["so"]
