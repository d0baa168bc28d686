"""Central user-level differential privacy (DP-FedAvg, McMahan et al. ICLR 2018; adaptive clipping,
Andrew et al. NeurIPS 2021) and its accounting (Google's dp-accounting). docs/privacy.md.

  rules.py       which configs keep a guarantee; every other one refused before any work
  accountant.py  epsilon of the sampling actually run (Poisson or fixed-size cohorts), calibration
  mechanism.py   per-client clipping into the exact sum, keyed Gaussian noise after the all_reduce
  adaptive.py    the clip norm that follows a quantile of the update norms, from a noised count
"""
