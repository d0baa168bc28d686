"""SlowMo (Wang et al., ICLR 2020) in the FL form of the FedADC paper (Algorithm 2): plain local SGD,
then server momentum on the pseudo-gradient g_bar = mean_i (theta_t - theta_i) / eta:
  m <- beta_global m + g_bar;   theta <- theta - alpha eta m        (alpha = algorithm.options.server_alpha)
This is exactly FedADC with beta_local = 0 (nothing embedded in the local steps), so it is that code
with beta_local (and the FedADC+ distillation) fixed to 0. See docs/algorithms/fedadc.md.
"""
from dataclasses import dataclass, field

from .fedadc import FedADC


class SlowMo(FedADC):
    name = "slowmo"
    tct_stage1 = True

    @dataclass
    class Options:
        beta_global: float = field(default=0.9, metadata={"range": "[0, 1)"})  # server momentum coefficient
        server_alpha: float = field(default=1.0, metadata={"range": "> 0"})  # server step scale (the paper's alpha)

    @classmethod
    def local_settings(cls, options) -> dict:
        return {"beta_local": 0.0, "variant": "nesterov", "kd_lambda": 0.0, "kd_temperature": 1.0}
