python -m distfl train experiments/foundation/text_adapt.yaml model.lora.rank=0 seed=0 output.dir=experiments/foundation/runs/text_full_s0
