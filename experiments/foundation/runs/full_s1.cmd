python -m distfl train experiments/foundation/adapt.yaml model.lora.rank=0 seed=1 output.dir=experiments/foundation/runs/full_s1
