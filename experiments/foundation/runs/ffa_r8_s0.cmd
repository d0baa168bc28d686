python -m distfl train experiments/foundation/adapt.yaml model.lora.aggregate=ffa seed=0 output.dir=experiments/foundation/runs/ffa_r8_s0
