"""SlowMo (Wang et al., ICLR 2020) in the FL form of the FedADC paper (Algorithm 2): plain local SGD,
then server momentum on the pseudo-gradient g_bar = mean_i (theta_t - theta_i) / eta:
  m <- beta_global m + g_bar;   theta <- theta - alpha eta m        (alpha = algorithm.server_alpha)
This is exactly FedADC with beta_local = 0 (nothing embedded in the local steps), so it is that code
with beta_local (and the FedADC+ distillation) fixed to 0. See docs/algorithms/fedadc.md.
"""
from .fedadc import FedADC


class SlowMo(FedADC):
    name = "slowmo"

    def _beta_local(self, a) -> float:
        return 0.0

    def _kd_lambda(self, a) -> float:
        return 0.0
