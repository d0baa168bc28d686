"""Central user-level differential privacy (DP-FedAvg, McMahan et al. ICLR 2018; adaptive clipping,
Andrew et al. NeurIPS 2021; DP-FTRL, Kairouz et al. ICML 2021, with tree aggregation or banded matrix
factorisation, Choquette-Choo et al. NeurIPS 2023) and its accounting (Google's dp-accounting).
docs/privacy.md.

  rules.py       which configs keep a guarantee; every other one refused before any work
  accountant.py  epsilon of the sampling or participation actually run, calibration
  mechanism.py   per-client clipping of the summed contribution, the noise after the all_reduce
  secret.py      where the noise and cohorts come from: a secret key (default) or the config's seed
  csprng.py      the secret key's generator: AES-128-CTR streams, their Gaussians and cohorts
  tree.py        DP-FTRL's tree-aggregated noise, restarted every floor(N / m) rounds
  banded.py      DP-FTRL's banded matrix factorisation noise
  adaptive.py    the clip norm that follows a quantile of the update norms, from a noised count
"""
