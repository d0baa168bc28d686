"""LEAF's word datasets. Sent140: tweets written as LEAF's data_to_json.py writes them (each CSV row after its
polarity, grouped by user, y 1 for polarity "4"), embs.json as models/sent140/get_embs.py writes it from
GloVe-style lines (a zero vector appended); Reddit: comments cut as data/reddit/source/preprocess.py's
create_seqs cuts them, the vocabulary as data/reddit/build_vocab.py builds and pickles it. Loaded and checked
element by element against a re-tokenisation written here; malformed files refused in one line; a pickle
holding an object never runs it; sent140_lstm 1 rank == 2 ranks == resumed, in packs == one at a time."""
from __future__ import annotations

import collections
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_packs_train_as_one_at_a_time, one_two_resumed, run_cli, summary, train_ok, write_config
from distfl.data.leaf import load_leaf
from distfl.errors import DataError

DIM = 300  # get_embs.py appends a zero vector of 300 numbers (glove.6B.300d)
# GloVe-style lines: lower-case words.
GLOVE_WORDS = ["of", ",", ".", "i", "love", "it", "!", "don't", "hate", "rain", "the", "?", "sun", "'s", "_x"]
TWEETS = {  # user -> [(polarity, text)]
    "alice": [("4", "I love the sun!"), ("0", "i hate rain, don't you?"), ("4", "sun's out... it's great!!"),
              ("0", "rain " * 30), ("4", "")],
    "bob": [("0", "The rain; the RAIN."), ("4", "love_x it it it"), ("0", "?!?! don't")],
    "carol": [("4", "ça va? i love it"), ("0", "hate hate hate the the the"), ("4", "i,love,it"),
              ("0", "rain"), ("4", "sun sun sun sun")],
}


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)


def write_embs(path: Path, words=GLOVE_WORDS, dim=DIM, seed=0) -> np.ndarray:
    """embs.json as get_embs.py writes it from a GloVe text file: vocab, and emba with a zero row appended."""
    rng = np.random.default_rng(seed)
    lines = [f"{w} " + " ".join(f"{v:.5f}" for v in rng.normal(size=dim)) for w in words]
    split = [line.split() for line in lines]
    emba = [[float(n) for n in parts[1:]] for parts in split] + [[0.0 for _ in range(dim)]]
    _write_json(path, {"vocab": [parts[0] for parts in split], "emba": emba})
    return np.array(emba, dtype=np.float32)


def sent140_records(tweets=TWEETS) -> list[list[str]]:
    """The rows of all_data.csv (combine_data.py): polarity, id, date, query, user, text, training|test."""
    rows, k = [], 0
    for user, items in tweets.items():
        for polarity, text in items:
            k += 1
            rows.append([polarity, str(1000 + k), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text, "training"])
    return rows


def write_sent140(root: Path, tweets=TWEETS, test_per_user: int = 1) -> dict:
    """data_to_json.py's grouping (rows sorted by user, x = row[1:], y = 1 if row[0] == "4" else 0), then each
    user's last `test_per_user` samples in test/, the others in train/, both in LEAF's JSON layout."""
    rows = sorted(sent140_records(tweets), key=lambda r: r[4])
    users = sorted({r[4] for r in rows})
    data = {u: {"x": [r[1:] for r in rows if r[4] == u], "y": [1 if r[0] == "4" else 0 for r in rows if r[4] == u]}
            for u in users}
    for split, part in (("train", slice(None, -test_per_user)), ("test", slice(-test_per_user, None))):
        user_data = {u: {"x": d["x"][part], "y": d["y"][part]} for u, d in data.items()}
        _write_json(root / split / f"all_data_niid_1_keep_0_{split}_9.json",
                    {"users": users, "num_samples": [len(user_data[u]["y"]) for u in users], "user_data": user_data})
    return data


def reference_ids(text: str, vocab: list[str]) -> list[int]:
    """An independent tokeniser: scan characters (word characters: letters, digits, _ and '; the marks
    . , ! ? ; alone), look each word's last index up by a scan, unknown = len(vocab), pad to 25."""
    words, current = [], ""
    for c in text:
        if c.isalnum() or c in "_'":
            current += c
            continue
        if current:
            words.append(current)
            current = ""
        if c in ".,!?;":
            words.append(c)
    if current:
        words.append(current)
    ids = []
    for w in words[:25]:
        hits = [i for i, v in enumerate(vocab) if v == w]
        ids.append(hits[-1] if hits else len(vocab))
    return ids + [len(vocab)] * (25 - len(ids))


def test_sent140_tweets_become_leafs_word_ids(tmp_path):
    table = write_embs(tmp_path / "embs.json")
    data = write_sent140(tmp_path / "leaf")
    fed = load_leaf(str(tmp_path / "leaf"), "sample", 0, embeddings=str(tmp_path / "embs.json"))
    assert fed.client_ids == ["alice", "bob", "carol"] and fed.num_classes == 2 and fed.name == "leaf-sent140"
    assert fed.train_x.dtype == np.int64 and fed.train_x.shape[1] == 25
    np.testing.assert_array_equal(fed.embeddings, table)
    for k, user in enumerate(fed.client_ids):
        x, y = data[user]["x"], data[user]["y"]
        lo, hi = fed.train_offsets[k], fed.train_offsets[k + 1]
        expect = [reference_ids(record[4], GLOVE_WORDS) for record in x[:-1]]
        assert fed.train_x[lo:hi].tolist() == expect
        assert fed.train_y[lo:hi].tolist() == y[:-1]
        lo, hi = fed.test_offsets[k], fed.test_offsets[k + 1]
        assert fed.test_x[lo:hi].tolist() == [reference_ids(x[-1][4], GLOVE_WORDS)] and fed.test_y[lo:hi].tolist() == y[-1:]
    unknown = len(GLOVE_WORDS)
    assert fed.train_x[0].tolist()[:6] == [unknown, 4, 10, 12, 6, unknown]  # "I" unknown: GloVe is lower case
    assert (fed.train_x == unknown).any() and fed.train_x.max() == unknown
    assert set(fed.sources) == {"data.path", "data.embeddings"}


@pytest.mark.parametrize("damage, message", [
    ("unset", "data.embeddings is not set, but data.path holds Sent140 tweets"),
    ("missing", "data.embeddings: cannot read"),
    ("no_zero_row", "has 15 vectors for 15 words; get_embs.py writes one a word and a zero vector"),
    ("ragged", "must be finite numbers, all of one length"),
    ("no_vocab", "must be a JSON object with vocab"),
    ("repeated", "repeats the word 'rain'"),
    ("no_text", "a Sent140 sample is a tweet record"),
    ("label", "Sent140 labels are 0 and 1"),
])
def test_sent140_malformed_is_refused_in_one_line(tmp_path, damage, message):
    write_embs(tmp_path / "embs.json")
    write_sent140(tmp_path / "leaf")
    embs = json.loads((tmp_path / "embs.json").read_text())
    train = tmp_path / "leaf" / "train" / "all_data_niid_1_keep_0_train_9.json"
    if damage == "no_zero_row":
        embs["emba"].pop()
    elif damage == "ragged":
        embs["emba"][3] = embs["emba"][3][:-1]
    elif damage == "no_vocab":
        embs.pop("vocab")
    elif damage == "repeated":
        embs["vocab"][0] = "rain"
    elif damage in ("no_text", "label"):
        d = json.loads(train.read_text())
        if damage == "no_text":
            d["user_data"]["bob"]["x"][0] = d["user_data"]["bob"]["x"][0][:4]
        else:
            d["user_data"]["bob"]["y"][0] = 4
        train.write_text(json.dumps(d))
    (tmp_path / "embs.json").write_text(json.dumps(embs))
    path = {"unset": "", "missing": str(tmp_path / "nowhere.json")}.get(damage, str(tmp_path / "embs.json"))
    with pytest.raises(DataError) as info:
        load_leaf(str(tmp_path / "leaf"), "sample", 0, embeddings=path)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_sent140_lstm_is_leafs_shape():
    """2 LSTM layers of 100 over the file's vectors, Dense 128, 2 classes; frozen: the vectors are no
    parameter and not in the state_dict (they are data); learned: LEAF's (words + 1) x 100 table."""
    from distfl.federation.local import FlatModel
    from distfl.models import build_model
    from distfl.schema import ModelConfig

    table = torch.randn(16, DIM)
    table[-1] = 0
    torch.manual_seed(0)
    frozen = build_model(ModelConfig(name="sent140_lstm"), (25,), 2, table)
    lstm = (DIM + 100) * 400 + 400 + (100 + 100) * 400 + 400
    assert sum(p.numel() for p in frozen.parameters()) == lstm + 100 * 128 + 128 + 128 * 2 + 2
    assert all("embedding" not in k for k in frozen.state_dict())
    flat = FlatModel(frozen)
    assert flat.frozen == [] and flat.buffers.numel() == 0 and flat.num_params == lstm + 100 * 128 + 128 + 258
    x = torch.randint(0, 16, (3, 25))
    expect = frozen.head(frozen.features.dense(frozen.features.lstm(table[x])))
    torch.testing.assert_close(frozen(x), expect)
    trained = build_model(ModelConfig(name="sent140_lstm", embedding="trained"), (25,), 2, table)
    assert sum(p.numel() for p in trained.parameters()) == 16 * DIM + lstm + 100 * 128 + 128 + 258
    learned = build_model(ModelConfig(name="sent140_lstm", embedding="learned"), (25,), 2, table)
    assert learned.features.embedding.weight.shape == (16, 100)


def _sent140_config(tmp_path: Path, **model) -> Path:
    write_embs(tmp_path / "embs.json")
    write_sent140(tmp_path / "leaf")
    return write_config(tmp_path / "s.yaml", {
        "seed": 3,
        "data": {"dataset": "leaf", "path": str(tmp_path / "leaf"), "embeddings": str(tmp_path / "embs.json")},
        "partition": {"scheme": "natural", "num_clients": 3},
        "model": {"name": "sent140_lstm", **model},
        "train": {"rounds": 2, "clients_per_round": 3, "lr": 0.3, "batch_size": 2},
        "eval": {"every": 1, "clients": True},
        "checkpoint": {"every": 1, "keep": 3},
        "output": {"progress": "none", "tensorboard": False},
    })


def test_sent140_lstm_one_rank_two_ranks_resumed(tmp_path):
    cfg = _sent140_config(tmp_path)
    one, _, _ = one_two_resumed(cfg, tmp_path, stop_at=1, rounds=2)
    assert one["final_test_acc"] is not None
    assert one["data_files"]["data.embeddings"]["sha256"]


def test_sent140_resume_refuses_changed_embeddings(tmp_path):
    cfg = _sent140_config(tmp_path)
    train_ok(cfg, f"output.dir={tmp_path / 'run'}", "train.rounds=1")
    write_embs(tmp_path / "embs.json", seed=1)
    proc = run_cli(["train", "--resume", str(tmp_path / "run"), "train.rounds=2"])
    assert proc.returncode != 0 and "data.embeddings" in proc.stderr and "changed since the run started" in proc.stderr


def test_sent140_lstm_trains_in_packs_as_one_at_a_time(tmp_path):
    assert_packs_train_as_one_at_a_time(_sent140_config(tmp_path), tmp_path, 2, "train.rounds=1")


def test_sent140_prepared_folder_trains_as_the_files(tmp_path):
    """`distfl data prepare leaf --embeddings` stores the ids and the vectors: a run from the folder gives
    the model of the run from LEAF's files."""
    cfg = _sent140_config(tmp_path)
    proc = run_cli(["data", "prepare", "leaf", "--from", str(tmp_path / "leaf"), "--out", str(tmp_path / "prep"),
                    "--embeddings", str(tmp_path / "embs.json")])
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "prep" / "meta.json").read_text())
    assert meta["embeddings"]["sha256"] == __import__("hashlib").sha256((tmp_path / "embs.json").read_bytes()).hexdigest()
    leaf = train_ok(cfg, f"output.dir={tmp_path / 'a'}", "train.rounds=1")
    prepared = train_ok(cfg, f"output.dir={tmp_path / 'b'}", "train.rounds=1", "data.dataset=prepared",
                        f"data.path={tmp_path / 'prep'}", "data.embeddings=")
    assert leaf["model_sha256"] == prepared["model_sha256"]
    missing = run_cli(["data", "prepare", "leaf", "--from", str(tmp_path / "leaf"), "--out", str(tmp_path / "p2")])
    assert missing.returncode == 2 and "data.embeddings is not set" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1 and not (tmp_path / "p2").exists()


def test_a_missing_word_file_is_refused_before_data_loads(tmp_path):
    from conftest import assert_refused

    cfg = _sent140_config(tmp_path)
    assert_refused(cfg, tmp_path / "r", [f"data.embeddings={tmp_path / 'nowhere.json'}"], "data.embeddings: no file at")
    assert_refused(cfg, tmp_path / "r", [f"data.vocabulary={tmp_path / 'nowhere.pck'}"], "data.vocabulary: no file at")
