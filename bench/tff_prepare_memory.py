"""Peak memory of `distfl data prepare tff` on StackOverflow-shaped files, streamed client by client
(what the command does) against reading the federation whole first (load_tff_folder, then
write_prepared: what it did before).

Writes, per size, a folder with stackoverflow_train.h5 / stackoverflow_test.h5 in TFF's layout
(examples/<user>/tokens, variable-length UTF-8 strings) of CLIENTS users with SENTENCES training and 2 test
sentences each (8-16 words drawn from a 12,000-word list, so some are out of the vocabulary) and a
10,001-line stackoverflow.word_count; then prepares it both ways, each in a fresh process, and reports
that process's peak resident memory (ru_maxrss of os.wait4) and its wall time.

    PYTHONPATH=. python bench/tff_prepare_memory.py [--clients 10000,40000] [--sentences 40] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

WHOLE = ("from distfl.data.prepared import write_prepared; from distfl.data.tff_text import load_tff_folder; "
         "import sys; write_prepared(load_tff_folder(sys.argv[1]), sys.argv[2], 'tff', sys.argv[1])")


def write_fixture(folder: str, clients: int, sentences: int) -> None:
    import h5py

    rng = np.random.default_rng(0)
    words = np.array([f"w{j}" for j in range(12_000)])
    with open(os.path.join(folder, "stackoverflow.word_count"), "w") as f:
        f.writelines(f"w{j} {20_000 - j}\n" for j in range(10_001))
    for split, per_client in (("train", sentences), ("test", 2)):
        with h5py.File(os.path.join(folder, f"stackoverflow_{split}.h5"), "w") as f:
            examples = f.create_group("examples")
            for k in range(clients):
                lengths = rng.integers(8, 17, per_client)
                picks = words[rng.integers(0, len(words), int(lengths.sum()))]
                cuts = np.cumsum(lengths)[:-1]
                texts = [" ".join(p) for p in np.split(picks, cuts)]
                examples.create_group(f"{k:08d}").create_dataset("tokens", data=texts,
                                                                 dtype=h5py.string_dtype("utf-8"))


def measure(cmd: list[str]) -> tuple[float, float]:
    """(peak resident MiB, seconds) of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with status {status}")
    return usage.ru_maxrss / 1024, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="10000,40000")
    parser.add_argument("--sentences", type=int, default=40)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    lines = [f"# {' '.join(sys.argv)}; peak resident memory of each preparation's process (os.wait4 ru_maxrss)",
             " clients  train_sentences  streamed_MiB  streamed_s  whole_MiB  whole_s"]
    for clients in (int(c) for c in args.clients.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            source = os.path.join(tmp, "so")
            os.makedirs(source)
            write_fixture(source, clients, args.sentences)
            streamed = measure([sys.executable, "-m", "distfl", "data", "prepare", "tff", "--from", source,
                                "--out", os.path.join(tmp, "streamed")])
            whole = measure([sys.executable, "-c", WHOLE, source, os.path.join(tmp, "whole")])
            lines.append(f"{clients:8d}  {clients * args.sentences:15d}  {streamed[0]:12.0f}  {streamed[1]:10.1f}  "
                         f"{whole[0]:9.0f}  {whole[1]:7.1f}")
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
