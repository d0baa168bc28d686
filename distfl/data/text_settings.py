"""data.sequence_length and data.oov_buckets checked before any data loads: TFF's text federations
(data/tff_text.py) are tokenised with them, and a prepared folder keeps the ones it was prepared with
(its meta.json), so a run asking for others is refused in one line."""
from __future__ import annotations

import os

import numpy as np

from distfl.data.prepared import read_meta
from distfl.data.tff import TEXT, find_federation
from distfl.data.tff_text import shakespeare_buckets
from distfl.errors import ConfigError, DataError


def folder_text_settings(folder: str) -> dict | None:
    """{"sequence_length", "oov_buckets"} a prepared folder was tokenised with; None for one that holds no
    TFF text. A folder prepared before they were recorded: its arrays' width, and one bucket."""
    meta = read_meta(folder)
    if not str(meta.get("name", "")).startswith("tff_") or "tokens" not in meta:
        return None
    if "sequence_length" in meta:
        return {"sequence_length": int(meta["sequence_length"]), "oov_buckets": int(meta.get("oov_buckets", 1))}
    try:
        width = int(np.load(os.path.join(folder, "train_x.npy"), mmap_mode="r").shape[1])
    except (OSError, ValueError, IndexError) as exc:
        raise DataError(f"data.path {folder}: cannot read train_x.npy ({exc}); prepare the dataset again") from None
    return {"sequence_length": width, "oov_buckets": 1}


def check_text_settings(v: dict) -> None:
    """ConfigError, before any data loads, for data.sequence_length or data.oov_buckets that the data at
    data.path cannot give (`v`: the dotted config values, data.path known to exist)."""
    length, buckets, dataset, path = (v["data.sequence_length"], v["data.oov_buckets"], v["data.dataset"],
                                      v["data.path"])
    if not (length or buckets) or dataset not in ("tff", "prepared"):
        return
    keys = " ".join(f"{k}={val}" for k, val in (("data.sequence_length", length), ("data.oov_buckets", buckets)) if val)
    if dataset == "tff":
        prefix = find_federation(path)
        if prefix not in TEXT:
            raise ConfigError(f"{keys}: only TFF's text federations (shakespeare, stackoverflow) are tokenised, but "
                              f"data.path {path} holds {prefix}; set them to 0")
        if prefix == "shakespeare" and buckets > 1:
            raise ConfigError(shakespeare_buckets(buckets))
        return
    held = folder_text_settings(path)
    if held is None:
        raise ConfigError(f"{keys}: data.path {path} was not prepared from TFF's Shakespeare or StackOverflow; "
                          "set them to 0")
    for key, flag, value, name in (("data.sequence_length", "--sequence-length", length, "sequence_length"),
                                   ("data.oov_buckets", "--oov-buckets", buckets, "oov_buckets")):
        if value and value != held[name]:
            raise ConfigError(f"{key}={value}, but data.path {path} was prepared with {name} {held[name]}: "
                              f"set {key}=0 (the folder's), or prepare another folder with {flag} {value}")
