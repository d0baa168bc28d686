"""data.sequence_length and data.oov_buckets on TFF's text federations: files written in TFF's layout,
re-tokenised here independently (TFF's get_special_tokens: word j -> j + 1, out-of-vocabulary buckets
V + 1 .. V + B, beginning V + B + 1, end V + B + 2; a word's bucket FarmHash Fingerprint64 mod B, as
tf.strings.to_hash_bucket_fast computes it), recorded in a prepared folder, refused in one line where the
data cannot give them, and the same model on 1 rank, 2 ranks and resumed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import assert_refused, one_two_resumed, run_cli, train_ok
from distfl.data.tff_text import CHAR_VOCAB, load_tff_folder, oov_bucket
from test_tff_text import SHAKESPEARE, _config, _shakespeare, _stackoverflow, _write_h5


def test_oov_buckets_are_tensorflows_fingerprint64_buckets():
    """Values TensorFlow publishes: its kernel test (Fingerprint64 of 'a'..'d' mod 10 -> 9, 2, 2, 5, from
    12917804110809363939, 11795596070477164822, 11430444447143000872, 4470636696479570465) and the
    example of tf.strings.to_hash_bucket_fast's documentation (["Hello", "TensorFlow", "2.x"], 3 -> 0, 2, 2)."""
    assert [oov_bucket(w, 10) for w in (b"a", b"b", b"c", b"d")] == [9, 2, 2, 5]
    assert [oov_bucket(w, 3) for w in (b"Hello", b"TensorFlow", b"2.x")] == [0, 2, 2]
    assert [oov_bucket(w, 2**64 - 1) for w in (b"a", b"d")] == [12917804110809363939, 4470636696479570465]
    assert oov_bucket(b"anything", 1) == 0


def _fingerprint64(word: str) -> int:
    import farmhash

    return farmhash.fingerprint64(word.encode("utf-8"))


def _tff_words(sentence: str, vocab: list[str], length: int, buckets: int) -> list[int]:
    """TFF's build_to_ids_fn with its get_special_tokens(V, B), then padded to length + 1."""
    v = len(vocab)
    oov, bos, eos = [v + 1 + n for n in range(buckets)], v + buckets + 1, v + buckets + 2
    words = sentence.split(" ")[:length]
    tokens = [vocab.index(w) + 1 if w in vocab else oov[_fingerprint64(w) % buckets] for w in words]
    tokens = [bos] + tokens + ([eos] if len(words) < length else [])
    return tokens + [0] * (length + 1 - len(tokens))


def _more_unknown_words(root: Path) -> dict:
    data = _stackoverflow(root)
    data["train"]["00003"].append("zebra yak quokka okapi narwhal axolotl the tapir dugong")
    _write_h5(root / "stackoverflow_train.h5", data["train"], "tokens")
    return data


@pytest.mark.parametrize("length, buckets", [(20, 1), (7, 4), (30, 3)])
def test_stackoverflow_length_and_buckets_as_tff_tokenises(tmp_path, length, buckets):
    data = _more_unknown_words(tmp_path)
    vocab = [line.split()[0] for line in (tmp_path / "stackoverflow.word_count").read_text().splitlines()][:10_000]
    fed = load_tff_folder(str(tmp_path), length if length != 20 else 0, buckets if buckets != 1 else 0)
    assert fed.num_classes == 10_003 + buckets and fed.train_x.shape[1] == length
    assert fed.tokens.unscored == (0, *range(10_001, 10_001 + buckets), 10_002 + buckets)  # pad, OOV, eos
    assert fed.text == {"sequence_length": length, "oov_buckets": buckets}
    for k, client in enumerate(fed.client_ids):
        expected = [_tff_words(s, vocab, length, buckets) for s in data["train"][client]]
        rows = slice(fed.train_offsets[k], fed.train_offsets[k + 1])
        assert fed.train_x[rows].tolist() == [e[:-1] for e in expected]
        assert fed.train_y[rows].tolist() == [e[1:] for e in expected]
    order = data["test"]["00001"] + data["test"]["00002"] + data["test"]["00009"]
    assert fed.test_y.tolist() == [_tff_words(s, vocab, length, buckets)[1:] for s in order]
    used = set(np.unique(fed.train_y[(fed.train_y > 10_000) & (fed.train_y <= 10_000 + buckets)]).tolist())
    assert len(used) >= min(buckets, 2)  # the unknown words do fall into several buckets


def _tff_char_pieces(snippet: str, length: int) -> list[list[int]]:
    tokens = [88] + [CHAR_VOCAB.find(chr(b)) + 1 if chr(b) in CHAR_VOCAB else 87 for b in snippet.encode()] + [89]
    tokens += [0] * (-len(tokens) % (length + 1))
    return [tokens[i:i + length + 1] for i in range(0, len(tokens), length + 1)]


def test_shakespeare_pieces_of_another_length(tmp_path):
    data = _shakespeare(tmp_path)
    fed = load_tff_folder(str(tmp_path), 30)
    assert fed.train_x.shape[1] == 30 and fed.text == {"sequence_length": 30}
    for split, x, y, offsets in (("train", fed.train_x, fed.train_y, fed.train_offsets),
                                 ("test", fed.test_x, fed.test_y, fed.test_offsets)):
        for k, client in enumerate(fed.client_ids):
            pieces = [p for s in data[split][client] for p in _tff_char_pieces(s, 30)]
            rows = slice(offsets[k], offsets[k + 1])
            assert x[rows].tolist() == [p[:-1] for p in pieces] and y[rows].tolist() == [p[1:] for p in pieces]
    sizes = [sum(-(-(len(s.encode()) + 2) // 31) for s in data["train"][c]) for c in sorted(SHAKESPEARE["train"])]
    assert np.diff(fed.train_offsets).tolist() == sizes


def test_prepared_folder_keeps_its_settings_and_refuses_others(tmp_path):
    """`distfl data prepare --sequence-length 7 --oov-buckets 4` records both; a run on the folder trains the
    model of the source read with the same keys, and one asking for other values stops in one line."""
    (tmp_path / "so").mkdir()
    _more_unknown_words(tmp_path / "so")
    out = tmp_path / "prepared"
    proc = run_cli(["data", "prepare", "tff", "--from", str(tmp_path / "so"), "--out", str(out),
                    "--sequence-length", "7", "--oov-buckets", "4"])
    assert proc.returncode == 0, proc.stderr
    import json

    meta = json.loads((out / "meta.json").read_text())
    assert (meta["sequence_length"], meta["oov_buckets"], meta["num_classes"]) == (7, 4, 10_007)
    cfg = _config(tmp_path, "so", "token_transformer")
    keys = ("data.sequence_length=7", "data.oov_buckets=4")
    direct = train_ok(cfg, f"output.dir={tmp_path / 'direct'}", *keys)
    prepared = train_ok(cfg, f"output.dir={tmp_path / 'prep'}", "data.dataset=prepared", f"data.path={out}")
    assert direct["model_sha256"] == prepared["model_sha256"] and direct["num_params"] == prepared["num_params"]
    default = train_ok(cfg, f"output.dir={tmp_path / 'default'}")
    # 3 more tokens (an embedding row of 128, an output row of 128 and a bias each), 13 fewer learned positions
    assert direct["num_params"] == default["num_params"] + 3 * (128 + 129) - 13 * 128
    for overrides, says in ((["data.sequence_length=20"], "data.sequence_length=20, but data.path"),
                            (["data.oov_buckets=1"], "data.oov_buckets=1, but data.path")):
        assert_refused(cfg, tmp_path / "refused", ["data.dataset=prepared", f"data.path={out}", *overrides], says)
    train_ok(cfg, f"output.dir={tmp_path / 'same'}", "data.dataset=prepared", f"data.path={out}", *keys)


def test_keys_the_data_cannot_give_are_refused_in_one_line(tmp_path):
    (tmp_path / "sh").mkdir()
    _shakespeare(tmp_path / "sh")
    cfg = _config(tmp_path, "sh", "shakespeare_lstm")
    assert_refused(cfg, tmp_path / "r", ["data.oov_buckets=3"], "TFF's Shakespeare has one out-of-vocabulary")
    proc = run_cli(["data", "prepare", "tff", "--from", str(tmp_path / "sh"), "--out", str(tmp_path / "p"),
                    "--oov-buckets", "3"])
    assert proc.returncode != 0 and "TFF's Shakespeare has one out-of-vocabulary" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "p").exists()


def test_stackoverflow_settings_one_rank_two_ranks_resumed(tmp_path):
    (tmp_path / "so").mkdir()
    _more_unknown_words(tmp_path / "so")
    one, _, _ = one_two_resumed(_config(tmp_path, "so", "token_transformer"), tmp_path, "train.rounds=3",
                                "data.sequence_length=7", "data.oov_buckets=4", stop_at=2, rounds=3)
    assert 0 <= one["final_test_acc"] <= 1
