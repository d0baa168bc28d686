python -m distfl train experiments/foundation/adapt.yaml model.lora.rank=16 model.lora.alpha=32 seed=1 output.dir=experiments/foundation/runs/fedit_r16_s1
