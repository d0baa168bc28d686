python -m distfl train experiments/foundation/adapt.yaml seed=1 output.dir=experiments/foundation/runs/fedit_r8_s1
