"""Which stage-2 (eta, M) trains, in minutes instead of an hour: SCAFFOLD's closed-form rounds (distfl.tct.solver) on
the first 600 rows of each client's normalised eNTK features of a #C=1 run (RUN_DIR/tct, tct.feature_store=disk,
10 clients of 6,000, 2 ranks, p = 100,000), scored on rows 5,800-5,999 of each client (label = the client's class).

    python experiments/tct/stage2_subset_probe.py RUN_DIR 2e-5:1250 5e-6:500 1e-6:500 2e-7:500

Prints each client's lambda_max and, per eta:M, the held-out accuracy after rounds 1, 2, 5, 10, 20, 30.
"""
import sys
import time

import numpy as np
import torch

from distfl.tct.solver import LocalLeastSquares, new_client_state, scaffold_client_round

torch.set_num_threads(2)
p, C, n = 100000, 10, 600
base = f"{sys.argv[1]}/tct"
Z, H = [], []
for k in range(C):
    z = np.memmap(f"{base}/rank{k%2}/client_{k}.float16", dtype=np.float16, mode="r", shape=(6000, p))
    Z.append(torch.from_numpy(np.array(z[:n])))
    H.append(torch.from_numpy(z[5800:6000].astype(np.float32)))
Ht = torch.cat(H); yt = torch.arange(C).repeat_interleave(200)
t0 = time.time()
sols = []
for k in range(C):
    Y = torch.full((n, C), -1.0 / C, dtype=torch.float64); Y[:, k] += 1
    s = LocalLeastSquares(Z[k], Y, dtype_compute=torch.float32); s.decompose(); sols.append(s)
lam = [s.lambda_max for s in sols]
print("decomposed in %.0fs; lambda_max per client:" % (time.time() - t0), [int(l) for l in lam], flush=True)
for eta, M in [(float(a), int(b)) for a, b in (v.split(":") for v in sys.argv[2:])]:
    psi = sols[0].zeros(); st = [new_client_state(s) for s in sols]; accs = []
    for t in range(1, 31):
        psi = sum(scaffold_client_round(s, psi, st[k], eta, M) for k, s in enumerate(sols)) / C
        if t in (1, 2, 5, 10, 20, 30):
            pred = (Ht.double() @ psi[:p] + psi[p]).argmax(1)
            accs.append((t, round(100 * (pred == yt).double().mean().item(), 1)))
    print(f"eta {eta:g} M {M} M*eta {M*eta:g} M*eta*lam_max {M*eta*max(lam):.0f}:", accs, flush=True)
