python -m distfl train experiments/foundation/text_adapt.yaml seed=0 output.dir=experiments/foundation/runs/text_lora_s0
