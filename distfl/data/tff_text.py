"""TFF's text federations as next-token tasks (data/tokens.py), tokenised as TFF's baselines
(tff.simulation.baselines: shakespeare/char_prediction_preprocessing.py and
stackoverflow/word_prediction_preprocessing.py) and Reddi et al. (ICLR 2021) do.

Shakespeare (`shakespeare_train.h5`, `shakespeare_test.h5`; 715 speaking roles, the same in both files):
each client's `snippets` are strings. A snippet's bytes map to TFF's 86-character vocabulary CHAR_VOCAB,
character j -> token j + 1, any other byte -> the out-of-vocabulary token 87; token 0 is padding, 88
beginning and 89 end of snippet (90 tokens). [88] + tokens + [89] is padded with 0 to a multiple of
L + 1 = 81 and cut into pieces of 81 (a snippet is never joined to another): each piece is one sample,
its first 80 tokens the input x, its last 80 the targets y (L = data.sequence_length, 80 by default). The accuracy leaves out padding only (TFF's
`MaskedCategoricalAccuracy(masked_tokens=[pad])`).

StackOverflow (`stackoverflow_train.h5`, `stackoverflow_test.h5`, and the vocabulary file
`stackoverflow.word_count` from TFF's `stackoverflow.word_count.tar.bz2`; 342,477 users): each client's
`tokens` are sentences of space-separated words. The vocabulary is the word-count file's first 10,000
words (its lines `word count`, most frequent first), word j -> token j + 1; B out-of-vocabulary tokens
10,001 .. 10,000 + B (data.oov_buckets, 1 by default: TFF's default and Reddi et al.'s setting); beginning
10,001 + B, end 10,002 + B; padding 0 (10,003 + B tokens; TFF's `get_special_tokens`). A word outside the
vocabulary goes to bucket Fingerprint64(its UTF-8 bytes) mod B, token 10,001 + bucket: TFF looks words up
in a `tf.lookup.StaticVocabularyTable`, which buckets them with `tf.strings.to_hash_bucket_fast`, FarmHash's
Fingerprint64 (pyfarmhash here). A sentence `split(' ')` keeps its first L = 20 words
(data.sequence_length), gets the end token if it had fewer than L, then the beginning token in front, and
is padded with 0 to L + 1: x its first L tokens, y its last L. The accuracy leaves out padding, every
out-of-vocabulary and the end token (TFF's `accuracy_without_out_of_vocab_or_end_of_sentence`; the
beginning token is never a target).

Test clients that are not training clients (StackOverflow's test file has users without training
sentences) make up the test split only, after the training clients' own test samples.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Callable

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


def stackoverflow_tokens(vocab_size: int, buckets: int = 1) -> tuple[int, tuple[int, ...], int, int]:
    """(pad, the out-of-vocabulary tokens, beginning, end) of TFF's StackOverflow with `buckets`
    out-of-vocabulary buckets (TFF's `get_special_tokens`)."""
    return PAD, tuple(vocab_size + 1 + n for n in range(buckets)), vocab_size + buckets + 1, vocab_size + buckets + 2


def oov_bucket(word: bytes, buckets: int) -> int:
    """The out-of-vocabulary bucket of a word: FarmHash Fingerprint64 of its bytes mod `buckets`, as
    `tf.strings.to_hash_bucket_fast` (and so TFF's StaticVocabularyTable) computes it."""
    if buckets == 1:
        return 0
    import farmhash  # pyfarmhash

    return farmhash.fingerprint64(word) % buckets


def _byte_table() -> np.ndarray:
    """Token of every byte value: CHAR_VOCAB's characters j -> j + 1, the others out-of-vocabulary."""
    table = np.full(256, shakespeare_tokens()[1], dtype=np.int64)
    for j, c in enumerate(CHAR_VOCAB):
        table[ord(c)] = j + 1
    return table


def check_strings(values, where: str) -> None:
    """DataError unless `values` (an array, or an h5py dataset before it is read) is 1-D of strings."""
    if values.ndim != 1 or not (values.dtype == object or values.dtype.kind in "SU"):
        raise DataError(f"data.path: {where} must be a 1-D array of strings, got {values.dtype} {values.shape}")


def _strings(values: np.ndarray, where: str) -> list[bytes]:
    """An h5py string dataset's values as bytes (variable-length bytes or str, or fixed-length)."""
    check_strings(values, where)
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


def stackoverflow_samples(sentences: list[bytes], index: dict[str, int], length: int = STACKOVERFLOW_LENGTH,
                          buckets: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(x, y), int64 N x length each, one sample a sentence (TFF's build_to_ids_fn, then padded_batch)."""
    _, oov, bos, eos = stackoverflow_tokens(len(index), buckets)
    rows = np.zeros((len(sentences), length + 1), dtype=np.int64)
    for n, sentence in enumerate(sentences):
        words = sentence.decode("utf-8").split(" ")[:length]
        tokens = [bos] + [index[w] + 1 if w in index else oov[oov_bucket(w.encode("utf-8"), buckets)] for w in words]
        tokens += [eos] if len(words) < length else []
        rows[n, :len(tokens)] = tokens
    return rows[:, :-1], rows[:, 1:]


@dataclass(frozen=True)
class TextFederation:
    """How one of TFF's text federations in a folder is read: its files, the feature each client holds,
    and how a client's strings become samples."""

    prefix: str  # shakespeare | stackoverflow
    train_path: str
    test_path: str
    feature: str  # snippets | tokens
    convert: Callable[[list[bytes]], tuple[np.ndarray, np.ndarray]]
    classes: int
    task: TokenTask
    settings: dict  # {"sequence_length": L[, "oov_buckets": B]}: recorded in a prepared folder's meta.json
    extra: tuple[str, ...] = ()  # other files read (StackOverflow's vocabulary)

    @property
    def sources(self) -> dict:
        paths = (self.train_path, self.test_path) + self.extra
        return {f"data.path {os.path.basename(p)}": (p, file_sha256(p)) for p in paths}

    def samples(self, path: str, client: str, group) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of one client of `path` (its h5py group)."""
        return self.convert(_strings(group[self.feature][()], f"{path}: client {client!r}'s {self.feature}"))

    def count(self, path: str, client: str, group) -> int:
        """The samples one client of `path` makes; StackOverflow's without reading them (a sentence each)."""
        if self.prefix == "stackoverflow":
            check_strings(group[self.feature], f"{path}: client {client!r}'s {self.feature}")
            return int(group[self.feature].shape[0])
        return len(self.samples(path, client, group)[1])

    def clients(self, path: str):
        """(client id, its samples (x, y)) of every client of `path`, in sorted order, one at a time."""
        for client, group in client_groups(path, (self.feature,)):
            yield client, self.samples(path, client, group)


def shakespeare_buckets(buckets: int) -> str:
    """Why Shakespeare refuses `buckets` > 1 out-of-vocabulary buckets."""
    return (f"data.oov_buckets={buckets}: TFF's Shakespeare has one out-of-vocabulary character token; several "
            "buckets are StackOverflow's (set data.oov_buckets=0)")


def text_federation(folder: str, prefix: str, sequence_length: int = 0, oov_buckets: int = 0) -> TextFederation:
    """The TextFederation of TFF's `prefix` files in `folder`; 0: TFF's default sequence length (80
    characters, 20 words) and one out-of-vocabulary bucket."""
    if sequence_length < 0 or oov_buckets < 0:
        raise DataError(f"a sequence length and out-of-vocabulary buckets are counts (0: TFF's defaults), got "
                        f"{sequence_length} and {oov_buckets}")
    train_path, test_path = split_paths(folder, prefix)
    if prefix == "shakespeare":
        if oov_buckets > 1:
            raise DataError(shakespeare_buckets(oov_buckets))
        length = sequence_length or SHAKESPEARE_LENGTH
        return TextFederation(prefix, train_path, test_path, "snippets", partial(shakespeare_samples, length=length),
                              len(CHAR_VOCAB) + 4, TokenTask("tff_shakespeare", (PAD,)), {"sequence_length": length})
    length, buckets = sequence_length or STACKOVERFLOW_LENGTH, oov_buckets or 1
    vocab_path = os.path.join(folder, WORD_COUNTS)
    words = read_vocabulary(vocab_path)
    index = {w: j for j, w in enumerate(words)}
    _, oov, _, eos = stackoverflow_tokens(len(words), buckets)
    return TextFederation(prefix, train_path, test_path, "tokens",
                          partial(stackoverflow_samples, index=index, length=length, buckets=buckets),
                          len(words) + 3 + buckets, TokenTask("tff_stackoverflow", (PAD, *oov, eos)),
                          {"sequence_length": length, "oov_buckets": buckets}, (vocab_path,))


def _read_text(fed: TextFederation, path: str) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    ids, xs, ys = [], [], []
    for client, (x, y) in fed.clients(path):
        ids.append(client)
        xs.append(x)
        ys.append(y)
    if not ids:
        raise DataError(f"data.path: {path}: 'examples' holds no client")
    return ids, xs, ys


def load_tff_folder(folder: str, sequence_length: int = 0, oov_buckets: int = 0) -> Federated:
    """Any of TFF's federations in `folder`: the text ones here (data.sequence_length, data.oov_buckets:
    0 for TFF's defaults), the image ones by data/tff.py."""
    prefix = find_federation(folder)
    if prefix not in TEXT:
        if sequence_length or oov_buckets:
            raise DataError(f"data.path {folder} holds {prefix}, images: a sequence length and out-of-vocabulary "
                            "buckets apply to TFF's text federations (shakespeare, stackoverflow) only")
        return load_tff(folder)
    fed = text_federation(folder, prefix, sequence_length, oov_buckets)
    train, test = _read_text(fed, fed.train_path), _read_text(fed, fed.test_path)
    out = assemble(fed.train_path, train, test, True, fed.classes, f"tff_{prefix}", fed.sources, tokens=fed.task)
    out.text = fed.settings
    return out

