"""LEAF's two word-level datasets (github.com/TalwalkarLab/leaf), whose vocabularies come from a second file:

Sent140 (tweets by user, positive or negative). A sample x is the tweet record LEAF's
data/sent140/preprocess/data_to_json.py writes (the CSV row after its polarity: id, date, query, user,
text, training|test), y is 1 for polarity "4" else 0. The words are LEAF's models/utils/language_utils.py:
`split_line` (the regex [\\w']+|[.,!?;], no lowercasing), `line_to_indices` (the first 25 words of field 4,
each word's index in the embeddings file's `vocab`, the unknown id len(word -> id) for any other word, and
the unknown id again to fill up to 25; a file that repeats a word is refused, as the unknown id would then
name a word's vector). The embeddings file is models/sent140/get_embs.py's embs.json:
{"vocab": [words], "emba": [vectors]}, one vector a word plus the zero vector it appends for the unknown
id (glove.6B.300d: 400,000 words + 1, 300 numbers each). data.embeddings names it.

Reddit (comments by user, next word). LEAF's data/reddit/source/preprocess.py writes each comment as
`x`: chunks of 10 tokens ("<BOS>" + the comment's words + "<EOS>", then "<PAD>" up to a multiple of 10),
and `y`: a dict per comment whose `target_tokens` are the same chunks shifted by one ("<PAD>" after
"<EOS>") and `count_tokens` 1 at the input's real tokens, 0 at padding. The vocabulary is
data/reddit/build_vocab.py's reddit_vocab.pck: a pickled dict {"vocab": word -> id, "size": 10000,
"unk_symbol": 1, "pad_symbol": 0}; a word not in it is unk_symbol (models/reddit/stacked_lstm.py's
defaultdict). It is read by distfl/plain_pickle.py's unpickler, which builds plain containers, strings and
numbers only and refuses any other object before it exists, or from the JSON file that
`python -m distfl.data.leaf_text convert reddit_vocab.pck OUT.json` writes. Each chunk is one sample (the
comments of a user flattened, as LEAF's batch_data does): x the input ids, y the target ids, scored per token
(data/tokens.py) with padding (id 0) and the unknown id left out. LEAF's loss weighs positions by
count_tokens instead, which also trains towards the "<PAD>" after each "<EOS>"; its accuracy counts the same
hits but divides by every input token (count_tokens' sum), so its numbers are lower than these.
LEAF's preprocess.py copies a user's whole comment count into every split's num_samples, so for Reddit
only x and y must agree in length.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np

from distfl.checkpoint import file_sha256
from distfl.data.tokens import PAD, TokenTask
from distfl.errors import ConfigError, DataError

SENT140_MAX_WORDS = 25  # line_to_indices's max_words, and stacked_lstm.py's seq_len
SENT140_TEXT = 4  # the tweet's text in a record (LEAF's data/sent140/README.md: fields 0..4)
SENT140_CLASSES = 2
_WORDS = re.compile(r"[\w']+|[.,!?;]")


def split_line(line: str) -> list[str]:
    """LEAF's split_line: words (letters, digits, _ and ') and the punctuation . , ! ? ; as tokens."""
    return _WORDS.findall(line)


def line_to_indices(line: str, word_ids: dict, max_words: int = SENT140_MAX_WORDS) -> list[int]:
    """LEAF's line_to_indices: the first `max_words` words' ids, the unknown id len(word_ids) for others and
    as the filling up to `max_words`."""
    unknown = len(word_ids)
    ids = [word_ids.get(w, unknown) for w in split_line(line)[:max_words]]
    return ids + [unknown] * (max_words - len(ids))


class Embeddings:
    """models/sent140/get_embs.py's embs.json: the vocabulary (word -> id, as LEAF's get_word_emb_arr builds
    it; a repeated word is refused) and the table, float32 (len(vocab) + 1) x D."""

    def __init__(self, path: str):
        if not path:
            raise DataError("data.embeddings is not set, but data.path holds Sent140 tweets: give LEAF's embs.json "
                            "(models/sent140/get_embs.sh writes it from GloVe; docs/datasets.md)")
        try:
            with open(path, "rb") as f:
                raw = f.read()
            data = json.loads(raw)
        except OSError as exc:
            raise DataError(f"data.embeddings: cannot read {path} ({exc.strerror})") from None
        except ValueError as exc:
            raise DataError(f"data.embeddings: {path} is not JSON ({exc}); give get_embs.py's embs.json") from None
        if not isinstance(data, dict) or not isinstance(data.get("vocab"), list) or not isinstance(data.get("emba"), list):
            raise DataError(f"data.embeddings: {path} must be a JSON object with vocab (a list of words) and emba "
                            "(a list of vectors), as LEAF's get_embs.py writes it")
        vocab, rows = data["vocab"], data["emba"]
        if not all(isinstance(w, str) for w in vocab):
            raise DataError(f"data.embeddings: {path}: vocab must hold words (strings)")
        if len(rows) != len(vocab) + 1:
            raise DataError(f"data.embeddings: {path} has {len(rows)} vectors for {len(vocab)} words; get_embs.py "
                            f"writes one a word and a zero vector for the unknown id: {len(vocab) + 1}")
        try:
            table = np.asarray(rows, dtype=np.float32)
        except (ValueError, TypeError):
            table = None
        if table is None or table.ndim != 2 or table.shape[1] < 1 or not np.isfinite(table).all():
            raise DataError(f"data.embeddings: {path}: the vectors (emba) must be finite numbers, all of one "
                            "length")
        self.path, self.table = path, table
        self.word_ids = {w: i for i, w in enumerate(vocab)}
        if len(self.word_ids) != len(vocab):  # LEAF's unknown id, len(word -> id), would name a word's vector
            repeated = next(w for i, w in enumerate(vocab) if self.word_ids[w] != i)
            raise DataError(f"data.embeddings: {path} repeats the word {repeated!r}; LEAF's unknown id is the number "
                            "of distinct words, so each word must appear once")
        self.sha256 = hashlib.sha256(raw).hexdigest()


def sent140_arrays(samples_x: list, samples_y: list, embeddings: Embeddings, where: str):
    """One user's tweets as LEAF's token ids (int64 n x 25) and labels 0/1."""
    for record in samples_x:
        if not isinstance(record, list) or len(record) <= SENT140_TEXT or not isinstance(record[SENT140_TEXT], str):
            raise DataError(f"data.path: {where}: a Sent140 sample is a tweet record (id, date, query, user, text, "
                            f"...) with the text at index {SENT140_TEXT}, got {str(record)[:80]}")
    if any(isinstance(v, bool) or v not in (0, 1) for v in samples_y):
        raise DataError(f"data.path: {where}: Sent140 labels are 0 and 1 (data_to_json.py: 1 for polarity 4), "
                        f"got {[v for v in samples_y if v not in (0, 1)][:3]}")
    x = np.array([line_to_indices(r[SENT140_TEXT], embeddings.word_ids) for r in samples_x], dtype=np.int64)
    return x, np.asarray(samples_y, dtype=np.int64)


class Vocabulary:
    """build_vocab.py's reddit_vocab.pck (or its JSON conversion): word -> id, size, unk_symbol, pad_symbol."""

    def __init__(self, path: str):
        if not path:
            raise DataError("data.vocabulary is not set, but data.path holds Reddit's token chunks: give LEAF's "
                            "reddit_vocab.pck (data/reddit/build_vocab.py writes it; docs/datasets.md)")
        from distfl.plain_pickle import load_plain

        try:
            data = load_plain(path, "LEAF's Reddit vocabulary")
        except OSError as exc:
            raise DataError(f"data.vocabulary: cannot read {path} ({exc.strerror})") from None
        except ConfigError as exc:
            raise DataError(f"data.vocabulary: {exc}") from None
        fields = ("vocab", "size", "unk_symbol", "pad_symbol")
        if not isinstance(data, dict) or any(k not in data for k in fields) or not isinstance(data["vocab"], dict):
            raise DataError(f"data.vocabulary: {path} must be a dict of {', '.join(fields)} (vocab: word -> id), as "
                            "LEAF's build_vocab.py pickles it")
        size, unk, pad = (data[k] for k in fields[1:])
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in [size, unk, pad, *data["vocab"].values()])
        if not ints or not all(isinstance(w, str) for w in data["vocab"]):
            raise DataError(f"data.vocabulary: {path}: vocab must map words to integer ids; size, unk_symbol and "
                            "pad_symbol must be integers")
        if pad != PAD or not 0 <= unk < size or any(not 0 <= i < size for i in data["vocab"].values()):
            raise DataError(f"data.vocabulary: {path}: every id must lie in 0..size-1 ({size}) and pad_symbol must be "
                            f"{PAD} (got pad_symbol {pad}, unk_symbol {unk})")
        self.word_ids, self.size, self.unknown = data["vocab"], size, unk
        self.sha256 = file_sha256(path)
        self.task = TokenTask("leaf-reddit", (PAD, unk) if unk != PAD else (PAD,))


def reddit_arrays(samples_x: list, samples_y: list, vocabulary: Vocabulary, where: str):
    """One user's comments as (inputs, targets), int64 chunks x L: every chunk of every comment, in order."""
    inputs, targets = [], []
    for chunks, label in zip(samples_x, samples_y):
        shifted = label.get("target_tokens") if isinstance(label, dict) else None
        if not (isinstance(chunks, list) and isinstance(shifted, list) and len(chunks) == len(shifted)):
            raise DataError(f"data.path: {where}: a Reddit y is a dict whose target_tokens hold as many chunks as "
                            "the comment's x (LEAF's preprocess.py)")
        for chunk, target in zip(chunks, shifted):
            if not (isinstance(chunk, list) and isinstance(target, list) and len(chunk) == len(target)
                    and all(isinstance(t, str) for t in chunk + target)):
                raise DataError(f"data.path: {where}: a chunk's tokens and targets must be lists of strings of one "
                                "length")
            inputs.append([vocabulary.word_ids.get(t, vocabulary.unknown) for t in chunk])
            targets.append([vocabulary.word_ids.get(t, vocabulary.unknown) for t in target])
    try:
        x, y = np.array(inputs, dtype=np.int64), np.array(targets, dtype=np.int64)
    except ValueError:
        raise DataError(f"data.path: {where}: Reddit's chunks must all have one length") from None
    return x.reshape(len(inputs), -1), y.reshape(len(targets), -1)


def is_reddit(entry: dict) -> bool:
    """Whether a user's samples are Reddit's (each x a list of token chunks)."""
    x = entry.get("x") if isinstance(entry, dict) else None
    return bool(isinstance(x, list) and x and isinstance(x[0], list) and x[0] and isinstance(x[0][0], list))


def convert(source: str, target: str) -> int:
    """Write a Reddit vocabulary pickle (read by the restricted unpickler, checked) as plain JSON."""
    vocabulary = Vocabulary(source)
    data = {"vocab": vocabulary.word_ids, "size": vocabulary.size, "unk_symbol": vocabulary.unknown,
            "pad_symbol": PAD}
    Path(target).write_text(json.dumps(data) + "\n")
    return len(vocabulary.word_ids)


def main(argv: list[str]) -> int:
    from distfl.plain_pickle import convert_command

    return convert_command(argv, "python -m distfl.data.leaf_text convert reddit_vocab.pck OUT.json", convert, "words")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
