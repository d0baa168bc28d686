python -m distfl train experiments/foundation/adapt.yaml model.lora.aggregate=ffa model.lora.alpha=64 seed=1 output.dir=experiments/foundation/runs/ffa_r8_a64_s1
