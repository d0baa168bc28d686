python -m distfl train experiments/foundation/adapt.yaml model.lora.rank=4 model.lora.alpha=8 seed=0 output.dir=experiments/foundation/runs/fedit_r4_s0
