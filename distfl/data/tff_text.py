"""TFF's text federations as next-token tasks (data/tokens.py), tokenised as TFF's baselines
(tff.simulation.baselines: shakespeare/char_prediction_preprocessing.py and
stackoverflow/word_prediction_preprocessing.py) and Reddi et al. (ICLR 2021) do.

Shakespeare (`shakespeare_train.h5`, `shakespeare_test.h5`; 715 speaking roles, the same in both files):
each client's `snippets` are strings. A snippet's bytes map to TFF's 86-character vocabulary CHAR_VOCAB,
character j -> token j + 1, any other byte -> the out-of-vocabulary token 87; token 0 is padding, 88
beginning and 89 end of snippet (90 tokens). [88] + tokens + [89] is padded with 0 to a multiple of
L + 1 = 81 and cut into pieces of 81 (a snippet is never joined to another): each piece is one sample,
its first 80 tokens the input x, its last 80 the targets y. The accuracy leaves out padding only (TFF's
`MaskedCategoricalAccuracy(masked_tokens=[pad])`).

StackOverflow (`stackoverflow_train.h5`, `stackoverflow_test.h5`, and the vocabulary file
`stackoverflow.word_count` from TFF's `stackoverflow.word_count.tar.bz2`; 342,477 users): each client's
`tokens` are sentences of space-separated words. The vocabulary is the word-count file's first 10,000
words (its lines `word count`, most frequent first), word j -> token j + 1; one out-of-vocabulary token
10,001; beginning 10,002, end 10,003; padding 0 (10,004 tokens). A sentence `split(' ')` keeps its first
L = 20 words, gets the end token if it had fewer than 20, then the beginning token in front, and is padded
with 0 to 21: x its first 20 tokens, y its last 20. The accuracy leaves out padding, out-of-vocabulary
and end tokens (TFF's `accuracy_without_out_of_vocab_or_end_of_sentence`; the beginning token is never a
target). TFF hashes words into several out-of-vocabulary buckets when asked; its default and the paper's
setting is one bucket, the only one read here.

Test clients that are not training clients (StackOverflow's test file has users without training
sentences) make up the test split only, after the training clients' own test samples.
"""
from __future__ import annotations

import os

import numpy as np

from distfl.data.natural import Federated
from distfl.data.tff import TEXT, assemble, client_groups, file_sha256, find_federation, load_tff, split_paths
from distfl.data.tokens import PAD, TokenTask
from distfl.errors import DataError

CHAR_VOCAB = 'dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#\'/37;?bfjnrvzBFJNRVZ"&*.26:\naeimquyAEIMQUY]!%)-159\r'
SHAKESPEARE_LENGTH = 80  # McMahan et al. 2017, TFF's preprocessing default, Reddi et al.
STACKOVERFLOW_LENGTH = 20
STACKOVERFLOW_VOCAB = 10_000
WORD_COUNTS = "stackoverflow.word_count"


def shakespeare_tokens() -> tuple[int, int, int, int]:
    """(pad, out-of-vocabulary, beginning, end) of TFF's Shakespeare."""
    v = len(CHAR_VOCAB)
    return PAD, v + 1, v + 2, v + 3


def stackoverflow_tokens(vocab_size: int) -> tuple[int, int, int, int]:
    """(pad, out-of-vocabulary, beginning, end) of TFF's StackOverflow with one out-of-vocabulary bucket."""
    return PAD, vocab_size + 1, vocab_size + 2, vocab_size + 3


def _byte_table() -> np.ndarray:
    """Token of every byte value: CHAR_VOCAB's characters j -> j + 1, the others out-of-vocabulary."""
    table = np.full(256, shakespeare_tokens()[1], dtype=np.int64)
    for j, c in enumerate(CHAR_VOCAB):
        table[ord(c)] = j + 1
    return table


def _strings(values: np.ndarray, where: str) -> list[bytes]:
    """An h5py string dataset's values as bytes (variable-length bytes or str, or fixed-length)."""
    if values.ndim != 1 or not (values.dtype == object or values.dtype.kind in "SU"):
        raise DataError(f"data.path: {where} must be a 1-D array of strings, got {values.dtype} {values.shape}")
    out = []
    for v in values:
        if isinstance(v, (bytes, np.bytes_)):
            out.append(bytes(v))
        elif isinstance(v, str):
            out.append(v.encode("utf-8"))
        else:
            raise DataError(f"data.path: {where} holds {type(v).__name__}, not strings")
    return out


def shakespeare_samples(snippets: list[bytes], length: int = SHAKESPEARE_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """(x, y), int64 N x length each, of one client's snippets (TFF's to_tokens_and_pad, then pieces)."""
    _, _, bos, eos = shakespeare_tokens()
    table, pieces = _byte_table(), []
    for snippet in snippets:
        tokens = np.concatenate([[bos], table[np.frombuffer(snippet, dtype=np.uint8)], [eos]])
        padded = np.zeros(-(-len(tokens) // (length + 1)) * (length + 1), dtype=np.int64)
        padded[:len(tokens)] = tokens
        pieces.append(padded.reshape(-1, length + 1))
    chunks = np.concatenate(pieces) if pieces else np.zeros((0, length + 1), np.int64)
    return chunks[:, :-1], chunks[:, 1:]


def read_vocabulary(path: str, size: int = STACKOVERFLOW_VOCAB) -> list[str]:
    """The first `size` words of TFF's word-count file (lines `word count`, most frequent first)."""
    words = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                fields = line.split()
                if len(fields) != 2 or not fields[1].isdigit():
                    raise DataError(f"data.path: {path} line {number} is not `word count` (TFF's {WORD_COUNTS})")
                words.append(fields[0])
                if len(words) == size:
                    break
    except OSError as exc:
        raise DataError(f"data.path: StackOverflow needs TFF's vocabulary file {WORD_COUNTS} beside its .h5 files "
                        f"(from stackoverflow.word_count.tar.bz2): {exc.strerror}: {path}") from None
    if len(words) < size:
        raise DataError(f"data.path: {path} lists {len(words)} words, fewer than the {size} of the vocabulary")
    return words


def stackoverflow_samples(sentences: list[bytes], index: dict[str, int],
                          length: int = STACKOVERFLOW_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """(x, y), int64 N x length each, one sample a sentence (TFF's build_to_ids_fn, then padded_batch)."""
    _, oov, bos, eos = stackoverflow_tokens(len(index))
    rows = np.zeros((len(sentences), length + 1), dtype=np.int64)
    for n, sentence in enumerate(sentences):
        words = sentence.decode("utf-8").split(" ")[:length]
        tokens = [bos] + [index[w] + 1 if w in index else oov for w in words] + ([eos] if len(words) < length else [])
        rows[n, :len(tokens)] = tokens
    return rows[:, :-1], rows[:, 1:]


def _read_text(path: str, feature: str, convert) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    ids, xs, ys = [], [], []
    for client, group in client_groups(path, (feature,)):
        x, y = convert(_strings(group[feature][()], f"{path}: client {client!r}'s {feature}"))
        ids.append(client)
        xs.append(x)
        ys.append(y)
    if not ids:
        raise DataError(f"data.path: {path}: 'examples' holds no client")
    return ids, xs, ys


def load_tff_folder(folder: str) -> Federated:
    """Any of TFF's federations in `folder`: the text ones here, the image ones by data/tff.py."""
    prefix = find_federation(folder)
    if prefix not in TEXT:
        return load_tff(folder)
    train_path, test_path = split_paths(folder, prefix)
    paths = [train_path, test_path]
    if prefix == "shakespeare":
        convert, feature = shakespeare_samples, "snippets"
        classes, task = len(CHAR_VOCAB) + 4, TokenTask("tff_shakespeare", (PAD,))
    else:
        vocab_path = os.path.join(folder, WORD_COUNTS)
        words = read_vocabulary(vocab_path)
        index = {w: j for j, w in enumerate(words)}
        _, oov, _, eos = stackoverflow_tokens(len(words))
        feature, classes = "tokens", len(words) + 4

        def convert(sentences):
            return stackoverflow_samples(sentences, index)

        task = TokenTask("tff_stackoverflow", (PAD, oov, eos))
        paths.append(vocab_path)
    train = _read_text(train_path, feature, convert)
    test = _read_text(test_path, feature, convert)
    sources = {f"data.path {os.path.basename(p)}": (p, file_sha256(p)) for p in paths}
    return assemble(train_path, train, test, True, classes, f"tff_{prefix}", sources, tokens=task)
