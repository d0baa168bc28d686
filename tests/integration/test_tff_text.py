"""TFF's text federations (Shakespeare, StackOverflow) as next-token tasks: files written with h5py in
TFF's layout (examples/<client id>/snippets or tokens, variable-length strings, read back as bytes the way
FedML's loaders decode them), tokenised as TFF's baseline preprocessing does (recomputed here from its
description, character by character and word by word), and scored per token: the loss over non-padding
targets, the accuracy without padding (and StackOverflow's out-of-vocabulary and end tokens), summed
exactly over clients by their token counts."""
from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conftest import (assert_packs_train_as_one_at_a_time, build_trainer, one_two_resumed, record_client_models,
                      run_cli, train_ok, write_config)
from distfl.data.tff_text import CHAR_VOCAB, load_tff_folder
from distfl.errors import DataError


def _write_h5(path: Path, clients: dict, feature: str, fixed: bool = False) -> None:
    """clients: id -> list of str; one group per client under `examples`, the strings in one dataset."""
    with h5py.File(path, "w") as f:
        examples = f.create_group("examples")
        for client, texts in clients.items():
            group = examples.create_group(client)
            if fixed:  # fixed-length byte strings
                group.create_dataset(feature, data=np.array([t.encode() for t in texts], dtype="S"))
            else:  # variable-length UTF-8 strings
                group.create_dataset(feature, data=texts, dtype=h5py.string_dtype("utf-8"))
            group.create_dataset("creation_date", data=["2010-01-01"] * len(texts), dtype=h5py.string_dtype("utf-8"))


def _snippet(rng, n: int) -> str:
    return "".join(rng.choice(list(CHAR_VOCAB[:-1]), n))  # any vocabulary character but "\r"


SHAKESPEARE = {
    "train": {"ALL_S_WELL_THAT_ENDS_WELL_CELIA": [79, 80, 5], "THE_TEMPEST_ARIEL": [200], "HAMLET_HAMLET": [3, 161]},
    "test": {"ALL_S_WELL_THAT_ENDS_WELL_CELIA": [30], "THE_TEMPEST_ARIEL": [90, 12], "HAMLET_HAMLET": [40]},
}


def _shakespeare(root: Path, fixed: bool = False, extra: str = "é~") -> dict:
    rng = np.random.default_rng(0)
    data = {}
    for split, sizes in SHAKESPEARE.items():
        data[split] = {c: [_snippet(rng, n) for n in ns] for c, ns in sizes.items()}
        first = next(iter(data[split]))
        data[split][first][-1] += extra  # a 2-byte character and one outside the vocabulary: 3 OOV tokens
        _write_h5(root / f"shakespeare_{split}.h5", data[split], "snippets", fixed)
    return data


def _tff_char_pieces(snippet: str) -> list[list[int]]:
    """TFF's Shakespeare pipeline, one step at a time: bytes -> CHAR_VOCAB index + 1 (OOV 87), bos 88 in
    front, eos 89 behind, zeros to a multiple of 81, pieces of 81."""
    tokens = [88] + [CHAR_VOCAB.find(chr(b)) + 1 if chr(b) in CHAR_VOCAB else 87 for b in snippet.encode()] + [89]
    while len(tokens) % 81:
        tokens.append(0)
    return [tokens[i:i + 81] for i in range(0, len(tokens), 81)]


@pytest.mark.parametrize("fixed", [False, True])
def test_shakespeare_snippets_are_cut_as_tff_cuts_them(tmp_path, fixed):
    data = _shakespeare(tmp_path, fixed)
    fed = load_tff_folder(str(tmp_path))
    assert fed.client_ids == sorted(SHAKESPEARE["train"]) and fed.num_classes == 90
    assert fed.tokens.unscored == (0,)  # TFF's accuracy masks padding only
    for split, x, y, offsets in (("train", fed.train_x, fed.train_y, fed.train_offsets),
                                 ("test", fed.test_x, fed.test_y, fed.test_offsets)):
        for k, client in enumerate(fed.client_ids):
            pieces = [p for s in data[split][client] for p in _tff_char_pieces(s)]
            rows = slice(offsets[k], offsets[k + 1])
            assert x[rows].tolist() == [p[:-1] for p in pieces] and y[rows].tolist() == [p[1:] for p in pieces]
    # 79 characters + bos + eos fill one piece exactly; 80 need two
    assert np.diff(fed.train_offsets).tolist() == [1 + 2 + 1, 1 + 3, 3]
    assert (fed.train_y == 87).sum() == 3 and fed.train_x.dtype == np.int64


def _stackoverflow(root: Path) -> dict:
    words = [f"w{j}" for j in range(10_000)]
    words[:4] = ["the", "to", ".", "a"]
    (root / "stackoverflow.word_count").write_text("".join(f"{w} {20_000 - j}\n" for j, w in enumerate(words))
                                                   + "zebra 1\n")  # the 10,001st word: out of the vocabulary
    long = " ".join(f"w{j}" for j in range(100, 125))
    twenty = " ".join(["the"] * 20)
    data = {"train": {"00001": ["the zebra to .", long], "00002": [twenty, "a  a"], "00003": ["w9999 w5"]},
            "test": {"00002": ["to the unknownword"], "00009": ["a ."], "00001": ["."]}}
    for split, clients in data.items():
        _write_h5(root / f"stackoverflow_{split}.h5", clients, "tokens")
    return data


def _tff_word_sample(sentence: str, vocab: list[str]) -> list[int]:
    """TFF's StackOverflow pipeline: split on ' ', keep 20 words, word j -> j + 1 (OOV 10,001), eos
    10,003 if fewer than 20 words, bos 10,002 in front, zeros to 21."""
    words = sentence.split(" ")[:20]
    tokens = [10_002] + [vocab.index(w) + 1 if w in vocab else 10_001 for w in words]
    tokens += [10_003] if len(words) < 20 else []
    return tokens + [0] * (21 - len(tokens))


def test_stackoverflow_sentences_are_tokenised_as_tff_does(tmp_path):
    data = _stackoverflow(tmp_path)
    vocab = [line.split()[0] for line in (tmp_path / "stackoverflow.word_count").read_text().splitlines()][:10_000]
    fed = load_tff_folder(str(tmp_path))
    assert fed.client_ids == ["00001", "00002", "00003"] and fed.num_classes == 10_004
    assert fed.tokens.unscored == (0, 10_001, 10_003)  # pad, out-of-vocabulary, end of sentence
    for k, client in enumerate(fed.client_ids):
        expected = [_tff_word_sample(s, vocab) for s in data["train"][client]]
        rows = slice(fed.train_offsets[k], fed.train_offsets[k + 1])
        assert fed.train_x[rows].tolist() == [e[:-1] for e in expected]
        assert fed.train_y[rows].tolist() == [e[1:] for e in expected]
    # each user's own test sentences, then the test-only user 00009, which belongs to no training client
    assert np.diff(fed.test_offsets).tolist() == [1, 1, 0]
    order = data["test"]["00001"] + data["test"]["00002"] + data["test"]["00009"]
    assert fed.test_y.tolist() == [_tff_word_sample(s, vocab)[1:] for s in order]


@pytest.mark.parametrize("damage, message", [
    (lambda root: (root / "stackoverflow.word_count").unlink(), "needs TFF's vocabulary file stackoverflow.word_count"),
    (lambda root: (root / "stackoverflow.word_count").write_text("the 3\nto 2\n"), "lists 2 words, fewer than the 10000"),
    (lambda root: (root / "stackoverflow.word_count").write_text("the three\n"), "line 1 is not `word count`"),
    (lambda root: _write_h5(root / "stackoverflow_test.h5", {"1": ["a"]}, "title"), "client '1' lacks tokens"),
])
def test_malformed_stackoverflow_is_refused_in_one_line(tmp_path, damage, message):
    _stackoverflow(tmp_path)
    damage(tmp_path)
    with pytest.raises(DataError, match=message) as info:
        load_tff_folder(str(tmp_path))
    assert "\n" not in str(info.value)


def test_numbers_where_snippets_belong_are_refused(tmp_path):
    _shakespeare(tmp_path)
    with h5py.File(tmp_path / "shakespeare_test.h5", "w") as f:
        f.create_group("examples").create_group("A").create_dataset("snippets", data=np.arange(3))
    with pytest.raises(DataError, match="snippets must be a 1-D array of strings"):
        load_tff_folder(str(tmp_path))


def _config(tmp_path: Path, name: str, model: str, **extra) -> Path:
    return write_config(tmp_path / f"{name}.yaml", {
        "seed": 3,
        "data": {"dataset": "tff", "path": str(tmp_path / name), "normalize": "none", "augment": "none"},
        "partition": {"scheme": "natural", "num_clients": 3},
        "model": {"name": model},
        "train": {"rounds": 2, "clients_per_round": 2, "lr": 0.5, "batch_size": 2},
        "eval": {"every": 1, "clients": True, "train_metrics": True},
        "checkpoint": {"every": 1, "keep": 5},
        "output": {"progress": "none", "tensorboard": False},
        **extra,
    })


def _independent_scores(model, x, y, unscored) -> tuple[float, int, int, int]:
    """(summed loss, its token count, correct, scored count), one token at a time in float64."""
    with torch.no_grad():
        logits = model(x).double()
    loss, tokens, correct, scored = 0.0, 0, 0, 0
    for i in range(y.shape[0]):
        for t in range(y.shape[1]):
            target, row = int(y[i, t]), logits[i, t].tolist()
            if target != 0:
                top = max(row)
                loss += top + math.log(sum(math.exp(v - top) for v in row)) - row[target]
                tokens += 1
            if target not in unscored:
                scored += 1
                correct += int(max(range(len(row)), key=row.__getitem__) == target)
    return loss, tokens, correct, scored


def test_token_metrics_recomputed_independently(tmp_path):
    """test_loss / test_acc / global_train_* and the per-client accuracies of a trained StackOverflow
    model equal a token-by-token recomputation: the loss over non-padding targets divided by their count,
    the accuracy without padding, out-of-vocabulary and end tokens, clients pooled by tokens."""
    (tmp_path / "so").mkdir()
    _stackoverflow(tmp_path / "so")
    trainer = build_trainer(_config(tmp_path, "so", "stackoverflow_lstm"), tmp_path / "r")
    trainer.run_round(1)
    trainer.run_round(2)  # the model now gets some tokens right: an accuracy of 0 would hide a wrong count
    got = trainer.evaluate_round(clients=True)
    model, data = trainer.worker.module, trainer.data
    model.eval()
    unscored = {0, 10_001, 10_003}
    for prefix, x, y in (("test_", data.test_x, data.test_y), ("global_train_", data.train_x, data.train_y)):
        loss, tokens, correct, scored = _independent_scores(model, x, y, unscored)
        assert got[f"{prefix}loss"] == pytest.approx(loss / tokens, rel=1e-6)  # float32 log-softmax
        assert got[f"{prefix}acc"] == correct / scored
        assert tokens < y.numel() and scored < tokens  # padding, OOV and eos were there to leave out
    hits, scores, accuracies = 0, 0, []
    for k in range(2):  # the clients' own test sentences (the test-only user belongs to none)
        rows = slice(int(data.test_offsets[k]), int(data.test_offsets[k + 1]))
        _, _, correct, scored = _independent_scores(model, data.test_x[rows], data.test_y[rows], unscored)
        hits, scores = hits + correct, scores + scored
        accuracies.append(correct / scored)
    assert hits > 0 and got["client_acc_weighted_mean"] == hits / scores
    assert got["client_acc_mean"] == pytest.approx(sum(accuracies) / 2, rel=1e-12)


def test_shakespeare_lstm_one_rank_two_ranks_resumed(tmp_path):
    (tmp_path / "sh").mkdir()
    _shakespeare(tmp_path / "sh")
    one, _, _ = one_two_resumed(_config(tmp_path, "sh", "shakespeare_lstm"), tmp_path, "train.rounds=3",
                                stop_at=2, rounds=3)
    assert 0 <= one["final_test_acc"] <= 1


def test_a_classification_model_is_refused_on_next_token_data(tmp_path):
    (tmp_path / "sh").mkdir()
    _shakespeare(tmp_path / "sh")
    proc = run_cli(["train", str(_config(tmp_path, "sh", "char_lstm")), f"output.dir={tmp_path / 'r'}"])
    assert proc.returncode == 2 and "is a next-token task" in proc.stderr, proc.stderr
    assert "shakespeare_lstm, stackoverflow_lstm" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_models_have_the_papers_sizes():
    from distfl.config.schema import ModelConfig
    from distfl.models import build_model

    for name, vocabulary, params in (("shakespeare_lstm", 90, 820_522), ("stackoverflow_lstm", 10_004, 4_050_748),
                                     ("token_transformer", 10_004, 2_970_388)):
        model = build_model(ModelConfig(name=name), (20,), vocabulary)
        assert sum(p.numel() for p in model.parameters()) == params
        assert model(torch.randint(0, vocabulary, (3, 20))).shape == (3, 20, vocabulary)


def test_transformer_attention_is_causal_and_equals_torchs():
    """Each head's attention equals torch's scaled_dot_product_attention with its causal mask, and a
    position's logits do not move when a later token changes."""
    from distfl.config.schema import ModelConfig
    from distfl.models import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(name="token_transformer"), (12,), 90)
    attention = model.features.blocks[0].attention
    x = torch.randn(3, 12, 128)
    q, k, v = (t.reshape(3, 12, 4, 32).transpose(1, 2) for t in attention.qkv(x).split(128, dim=-1))
    heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attention(x), attention.out(heads.transpose(1, 2).reshape(3, 12, 128)))
    tokens = torch.randint(1, 90, (2, 12))
    later = tokens.clone()
    later[:, 7:] = torch.randint(1, 90, (2, 5))
    with torch.no_grad():
        a, b = model(tokens), model(later)
    assert torch.equal(a[:, :7], b[:, :7]) and not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("model", ["shakespeare_lstm", "token_transformer"])
def test_token_models_train_in_packs_as_one_at_a_time(tmp_path, model):
    """The per-token loss vectorises over a pack of clients (torch.func): a round in a pack of 3 gives
    the model of one client at a time, up to float rounding."""
    (tmp_path / "sh").mkdir()
    _shakespeare(tmp_path / "sh")
    assert_packs_train_as_one_at_a_time(_config(tmp_path, "sh", model), tmp_path, 3, "train.clients_per_round=3")


def test_prepared_stackoverflow_keeps_its_tokens_and_trains_the_same_model(tmp_path):
    from distfl.data.prepared import load_prepared

    (tmp_path / "so").mkdir()
    _stackoverflow(tmp_path / "so")
    out = tmp_path / "prepared"
    proc = run_cli(["data", "prepare", "tff", "--from", str(tmp_path / "so"), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    source, ours = load_tff_folder(str(tmp_path / "so")), load_prepared(str(out))
    assert ours.tokens == source.tokens and ours.num_classes == 10_004 and ours.client_ids.tolist() == source.client_ids
    for key in ("train_x", "train_y", "train_offsets", "test_x", "test_y", "test_offsets"):
        np.testing.assert_array_equal(getattr(ours, key), getattr(source, key))
    cfg = _config(tmp_path, "so", "stackoverflow_lstm")
    direct = train_ok(cfg, f"output.dir={tmp_path / 'direct'}")
    prepared = train_ok(cfg, f"output.dir={tmp_path / 'prep'}", "data.dataset=prepared", f"data.path={out}")
    assert direct["model_sha256"] == prepared["model_sha256"]
    assert direct["final_test_acc"] == prepared["final_test_acc"]


def test_a_method_counting_classes_is_refused_on_next_token_data(tmp_path):
    (tmp_path / "sh").mkdir()
    _shakespeare(tmp_path / "sh")
    proc = run_cli(["train", str(_config(tmp_path, "sh", "shakespeare_lstm")), f"output.dir={tmp_path / 'r'}",
                    "algorithm.name=fedlc"])
    assert proc.returncode != 0 and "the data's samples have no class (a next-token task)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_clients_weighted_by_their_tokens(tmp_path):
    """algorithm.weighting=tokens: a client's weight is its non-padding target tokens over the cohort's
    (a snippet's bytes, begin and end tokens, less the first token of each piece, which is only an input),
    and the new global model is the so-weighted mean of the client models."""
    (tmp_path / "sh").mkdir()
    data = _shakespeare(tmp_path / "sh")
    trainer = build_trainer(_config(tmp_path, "sh", "shakespeare_lstm"), tmp_path / "r", "algorithm.weighting=tokens",
                            "train.clients_per_round=3")
    seen = record_client_models(trainer)
    trainer.run_round(1)
    def targets(snippet: str) -> int:  # its n = bytes + 2 tokens less the first of each piece of 81, never a target
        n = len(snippet.encode()) + 2
        return n - -(-n // 81)

    tokens = [sum(targets(s) for s in data["train"][c]) for c in sorted(data["train"])]
    assert [w for _, w in seen] == [t / sum(tokens) for t in tokens]
    torch.testing.assert_close(trainer.global_params, sum(w * p for p, w in seen), rtol=1e-5, atol=1e-6)


def test_token_weighting_needs_next_token_data(tmp_path, small_config):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'r'}", "algorithm.weighting=tokens"])
    assert proc.returncode == 2 and "algorithm.weighting=tokens weighs clients by their target tokens" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_held_out_client_samples_of_next_token_data(tmp_path):
    """eval.client_split=holdout on next-token data: each client's held-out sequences leave its training
    samples (a plain random holdout, there being no class to stratify by) and score its accuracy by token."""
    (tmp_path / "sh").mkdir()
    _shakespeare(tmp_path / "sh")
    trainer = build_trainer(_config(tmp_path, "sh", "shakespeare_lstm"), tmp_path / "r", "eval.client_split=holdout",
                            "eval.client_holdout=0.5")
    held = [idx.numpy() for idx in trainer.client_test]
    for k in range(3):
        own = np.arange(trainer.data.train_offsets[k], trainer.data.train_offsets[k + 1])
        assert sorted(np.concatenate([trainer.population.indices[k], held[k]]).tolist()) == own.tolist()
        assert len(held[k]) == 2  # round(0.5 n) of n = 4, 4, 3 sequences
    trainer.run_round(1)
    got = trainer.evaluate_round(clients=True)
    model = trainer.worker.module
    model.eval()
    hits = scores = 0
    for h in held:
        rows = torch.from_numpy(h)
        _, _, correct, scored = _independent_scores(model, trainer.data.train_x[rows], trainer.data.train_y[rows], {0})
        hits, scores = hits + correct, scores + scored
    assert got["client_acc_weighted_mean"] == hits / scores


def test_distfl_partition_refuses_next_token_data(tmp_path):
    (tmp_path / "sh").mkdir()
    _shakespeare(tmp_path / "sh")
    proc = run_cli(["partition", str(_config(tmp_path, "sh", "shakespeare_lstm"))])
    assert proc.returncode == 2 and "is a next-token dataset split by its own clients" in proc.stderr, proc.stderr
