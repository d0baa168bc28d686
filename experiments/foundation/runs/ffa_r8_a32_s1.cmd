python -m distfl train experiments/foundation/adapt.yaml model.lora.aggregate=ffa model.lora.alpha=32 seed=1 output.dir=experiments/foundation/runs/ffa_r8_a32_s1
