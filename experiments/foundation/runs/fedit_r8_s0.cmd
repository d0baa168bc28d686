python -m distfl train experiments/foundation/adapt.yaml seed=0 output.dir=experiments/foundation/runs/fedit_r8_s0
