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
    from distfl.config.schema import ModelConfig

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


# ------------------------------------------------------------------------------------------------ Reddit
COMMENTS = {  # LEAF's user ids are numbers as strings (get_json.py); comments already tokenised, lower case
    "1": ["i think so", "no way , really ?", "this is the best thing i have seen in a long time ! ! !",
          "lol", "so true", "i think it is"],
    "2": ["the best", "no", "what is this ?", "i have no idea what you mean", "ok"],
    "3": ["thanks !", "this"],
}
SEQ = 10  # preprocess.py's SEQ_LEN


def create_seqs(comments: list[str], metas: list[dict]):
    """preprocess.py's create_seqs with lists: <BOS> words <EOS> as input, words <EOS> <PAD> as target, both
    padded with <PAD> to a multiple of 10 and cut in chunks of 10; count_tokens 1.0 at the input's tokens."""
    xs, ys = [], []
    for comment, meta in zip(comments, metas):
        c_tokens = ["<BOS>"] + comment.split() + ["<EOS>"]
        t_tokens = comment.split() + ["<EOS>", "<PAD>"]
        counts = [1.0] * len(c_tokens) + [0.0] * (-len(c_tokens) % SEQ)
        c_tokens += ["<PAD>"] * (-len(c_tokens) % SEQ)
        t_tokens += ["<PAD>"] * (-len(t_tokens) % SEQ)
        chunk = lambda seq: [seq[i:i + SEQ] for i in range(0, len(seq), SEQ)]  # noqa: E731
        xs.append(chunk(c_tokens))
        ys.append(dict(meta, target_tokens=chunk(t_tokens), count_tokens=chunk(counts)))
    return xs, ys


def write_reddit(root: Path) -> dict:
    """train/val/test as preprocess.py's process_file writes them: comments ordered by created_utc, the first
    int(0.6 n) to train, up to int(0.8 n) to val, the rest to test; num_samples the user's whole count."""
    users = list(COMMENTS)
    splits = {"train": {}, "val": {}, "test": {}}
    for u in users:
        comments = COMMENTS[u]
        metas = [{"subreddit": "r/x", "created_utc": 1512086400.0 + i, "score": i} for i in range(len(comments))]
        n = len(comments)
        for name, part in (("train", slice(0, int(0.6 * n))), ("val", slice(int(0.6 * n), int(0.8 * n))),
                           ("test", slice(int(0.8 * n), None))):
            x, y = create_seqs(comments[part], metas[part])
            splits[name][u] = {"x": x, "y": y}
    for name, user_data in splits.items():
        _write_json(root / name / f"reddit_0_{name}.json",
                    {"users": users, "num_samples": [len(COMMENTS[u]) for u in users], "user_data": user_data})
    return splits


def write_vocab(path: Path, train: dict, vocab_size: int = 14) -> dict:
    """build_vocab.py: count the training chunks' tokens, keep the vocab_size - 2 most frequent (ties by
    word), <PAD> 0, <UNK> 1, the i-th word i + 1 (skipping <PAD>); pickle.dump of a plain dict."""
    counter = collections.Counter(t for entry in train.values() for comment in entry["x"] for chunk in comment
                                  for t in chunk)
    words = [w for w, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab_size - 2]]
    vocab = {"<PAD>": 0, "<UNK>": 1}
    for i, w in enumerate(words):
        if w != "<PAD>":
            vocab[w] = i + 1
    data = {"vocab": vocab, "size": vocab_size, "unk_symbol": 1, "pad_symbol": 0}
    with open(path, "wb") as f:
        pickle.dump(data, f)
    return data


def test_reddit_chunks_become_next_word_ids(tmp_path):
    splits = write_reddit(tmp_path / "leaf")
    vocab_file = write_vocab(tmp_path / "reddit_vocab.pck", splits["train"])
    lookup = collections.defaultdict(lambda: vocab_file["unk_symbol"])  # models/reddit/stacked_lstm.py's load_vocab
    lookup.update(vocab_file["vocab"])
    fed = load_leaf(str(tmp_path / "leaf"), "sample", 0, vocabulary=str(tmp_path / "reddit_vocab.pck"))
    assert fed.client_ids == ["1", "2", "3"] and fed.num_classes == 14 and fed.tokens.unscored == (0, 1)
    for which, x, y, offsets in (("train", fed.train_x, fed.train_y, fed.train_offsets),
                                 ("test", fed.test_x, fed.test_y, fed.test_offsets)):
        for k, user in enumerate(fed.client_ids):
            entry = splits[which][user]
            want_x = [[lookup[t] for t in chunk] for comment in entry["x"] for chunk in comment]
            want_y = [[lookup[t] for t in chunk] for label in entry["y"] for chunk in label["target_tokens"]]
            assert x[offsets[k]:offsets[k + 1]].tolist() == want_x, (which, user)
            assert y[offsets[k]:offsets[k + 1]].tolist() == want_y, (which, user)
    assert fed.train_x.shape[1] == SEQ and fed.train_offsets.tolist() == [0, 4, 7, 8]  # 1 + 1 + 2 chunks; 1 + 1 + 1; 1
    assert set(fed.sources) == {"data.path", "data.vocabulary"}
    # The JSON conversion reads back to the same arrays.
    from distfl.data.leaf_text import main

    assert main(["convert", str(tmp_path / "reddit_vocab.pck"), str(tmp_path / "vocab.json")]) == 0
    assert json.loads((tmp_path / "vocab.json").read_text()) == vocab_file
    again = load_leaf(str(tmp_path / "leaf"), "sample", 0, vocabulary=str(tmp_path / "vocab.json"))
    assert np.array_equal(again.train_x, fed.train_x) and np.array_equal(again.test_y, fed.test_y)
    # A prepared folder keeps the ids, the token task and the vocabulary file's hash.
    from distfl.data.prepared import load_prepared

    proc = run_cli(["data", "prepare", "leaf", "--from", str(tmp_path / "leaf"), "--out", str(tmp_path / "prep"),
                    "--vocabulary", str(tmp_path / "reddit_vocab.pck")])
    assert proc.returncode == 0, proc.stderr
    prepared = load_prepared(str(tmp_path / "prep"))
    assert prepared.tokens == fed.tokens and np.array_equal(prepared.train_y, fed.train_y)
    assert json.loads((tmp_path / "prep" / "meta.json").read_text())["vocabulary"]["sha256"] == fed.sources["data.vocabulary"][1]


class _Payload:
    marker: Path

    def __reduce__(self):
        import os

        return (os.system, (f"touch {_Payload.marker}",))


@pytest.mark.parametrize("damage, message", [
    ("object", "only plain data"),
    ("unset", "data.vocabulary is not set, but data.path holds Reddit's token chunks"),
    ("pad", "pad_symbol must be 0"),
    ("ids", "every id must lie in 0..size-1"),
    ("fields", "must be a dict of vocab, size, unk_symbol, pad_symbol"),
    ("lengths", "has 3 x and 4 y; each Reddit comment"),
])
def test_reddit_malformed_is_refused_in_one_line(tmp_path, damage, message):
    splits = write_reddit(tmp_path / "leaf")
    vocab = write_vocab(tmp_path / "v.pck", splits["train"])
    _Payload.marker = tmp_path / "ran"
    if damage == "object":
        vocab["vocab"]["lol"] = _Payload()
    elif damage == "pad":
        vocab["pad_symbol"] = 3
    elif damage == "ids":
        vocab["vocab"]["lol"] = 14
    elif damage == "fields":
        vocab.pop("size")
    elif damage == "lengths":
        train = tmp_path / "leaf" / "train" / "reddit_0_train.json"
        d = json.loads(train.read_text())
        d["user_data"]["2"]["y"].append(d["user_data"]["2"]["y"][0])
        train.write_text(json.dumps(d))
    (tmp_path / "v.pck").write_bytes(pickle.dumps(vocab))
    with pytest.raises(DataError) as info:
        load_leaf(str(tmp_path / "leaf"), "sample", 0, vocabulary="" if damage == "unset" else str(tmp_path / "v.pck"))
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert not _Payload.marker.exists()


def test_reddit_lstm_is_leafs_shape():
    from distfl.models import build_model
    from distfl.config.schema import ModelConfig

    torch.manual_seed(0)
    model = build_model(ModelConfig(name="reddit_lstm"), (SEQ,), 10_000)
    assert sum(p.numel() for p in model.parameters()) == 6_180_624  # 10000x256 + 2 x (512x1024 + 1024) + 256x10001
    assert model(torch.randint(0, 10_000, (2, SEQ))).shape == (2, SEQ, 10_000)
    lstm_biases = [p for n, p in model.named_parameters() if n.startswith("features.lstm.") and n.endswith("bias")]
    assert all((b == 0).all() for b in lstm_biases)
    assert max(p.abs().max() for p in model.parameters()) <= 0.1


def _reddit_config(tmp_path: Path) -> Path:
    splits = write_reddit(tmp_path / "leaf")
    write_vocab(tmp_path / "v.pck", splits["train"])
    return write_config(tmp_path / "r.yaml", {
        "seed": 1,
        "data": {"dataset": "leaf", "path": str(tmp_path / "leaf"), "vocabulary": str(tmp_path / "v.pck")},
        "partition": {"scheme": "natural", "num_clients": 3},
        "model": {"name": "reddit_lstm"},
        "train": {"rounds": 2, "clients_per_round": 3, "lr": 0.5, "batch_size": 2},
        "algorithm": {"weighting": "tokens"},
        "eval": {"every": 1},
        "checkpoint": {"every": 1, "keep": 3},
        "output": {"progress": "none", "tensorboard": False},
    })


def test_reddit_lstm_one_rank_two_ranks_resumed(tmp_path):
    one, _, _ = one_two_resumed(_reddit_config(tmp_path), tmp_path, stop_at=1, rounds=2)
    assert one["final_test_acc"] is not None and one["data_files"]["data.vocabulary"]["sha256"]


def test_reddit_lstm_trains_in_packs_as_one_at_a_time(tmp_path):
    assert_packs_train_as_one_at_a_time(_reddit_config(tmp_path), tmp_path, 2, "train.rounds=1")
