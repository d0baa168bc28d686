"""`distfl bench --suite privacy`: what a private run's randomness costs per round (docs/privacy.md).

Seconds to draw 10^6 standard normals (one million model parameters' noise) in each mode of
privacy.secure_noise, on one thread, medians of `repeats` interleaved measurements:
  secret   AES-128-CTR keystream, 53-bit uniforms, Box-Muller in float64 (csprng.normal), on `device`;
  keystream  the AES-128-CTR bytes alone (8 MB), the part that runs on the host whatever the device;
  keyed    torch's generator seeded by the config's seed (secret.keyed_normal), on `device`;
and a secret Poisson cohort of 100,000 clients (csprng.cohort), against numpy's keyed one.
"""
from __future__ import annotations

import statistics
import time

NUMEL = 1_000_000
COHORT_CLIENTS, COHORT_SIZE = 100_000, 100
KEY = (1 << 127) | 0x0123456789ABCDEF  # any 128-bit key: the cost does not depend on it


def bench(repeats: int, log, device: str | None = None) -> dict:
    import numpy as np
    import torch

    from ..federation.population import Population
    from ..privacy import csprng, secret

    device = torch.device(device or "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    population = Population([np.arange(i, i + 1) for i in range(COHORT_CLIENTS)])

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    draws = {
        "secret_normal_s": lambda t: csprng.normal(KEY, 11, 0, t, NUMEL, device),
        "keystream_s": lambda t: csprng.keystream(KEY, csprng.counter_block(11, 0, t), 8 * NUMEL),
        "keyed_normal_s": lambda t: secret.keyed_normal([KEY, 11, t, 0], NUMEL, device),
        "secret_cohort_s": lambda t: csprng.cohort(KEY, 3, t, COHORT_CLIENTS, COHORT_SIZE, "poisson"),
        "keyed_cohort_s": lambda t: population.cohort(KEY, t, COHORT_SIZE, "poisson"),
    }
    times = {name: [] for name in draws}
    try:
        log("warm-up: one draw of each (untimed)")
        for draw in draws.values():
            draw(0)
        sync()
        for rep in range(repeats):
            order = list(draws) if rep % 2 == 0 else list(reversed(draws))
            for name in order:
                t0 = time.perf_counter()
                draws[name](rep + 1)
                sync()
                times[name].append(time.perf_counter() - t0)
            log(f"repeat {rep + 1}/{repeats}: secret {times['secret_normal_s'][-1]:.4f} s, "
                f"keyed {times['keyed_normal_s'][-1]:.4f} s per 10^6 normals")
    finally:
        torch.set_num_threads(threads)
    medians = {f"{name}_median": statistics.median(values) for name, values in times.items()}
    return {"device": str(device), "threads": 1, "numel": NUMEL, "cohort_clients": COHORT_CLIENTS,
            "cohort_size": COHORT_SIZE, "repeats": repeats, **times, **medians,
            "secret_over_keyed": medians["secret_normal_s_median"] / medians["keyed_normal_s_median"]}


def markdown(res: dict) -> str:
    return (
        f"# distfl bench --suite privacy ({res['date']})\n\n"
        f"Device {res['device']}, 1 thread; medians of {res['repeats']} interleaved repeats.\n\n"
        "| what | median | note |\n|---|---|---|\n"
        f"| secret noise: 10^6 normals (AES-128-CTR, Box-Muller) | {res['secret_normal_s_median']:.4f} s | "
        "privacy.secure_noise=true, per million parameters a round |\n"
        f"| of which the AES-128-CTR keystream (8 MB) | {res['keystream_s_median']:.4f} s | on the host |\n"
        f"| keyed noise: 10^6 normals (torch's generator) | {res['keyed_normal_s_median']:.4f} s | "
        "privacy.secure_noise=false |\n"
        f"| secret / keyed | {res['secret_over_keyed']:.2f} | |\n"
        f"| secret Poisson cohort, {res['cohort_clients']:,} clients | {1e3 * res['secret_cohort_s_median']:.2f} ms | "
        "per round |\n"
        f"| keyed Poisson cohort, {res['cohort_clients']:,} clients | {1e3 * res['keyed_cohort_s_median']:.2f} ms | "
        "numpy's generator |\n")
