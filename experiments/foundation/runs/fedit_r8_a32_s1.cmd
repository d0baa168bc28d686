python -m distfl train experiments/foundation/adapt.yaml model.lora.alpha=32 seed=1 output.dir=experiments/foundation/runs/fedit_r8_a32_s1
