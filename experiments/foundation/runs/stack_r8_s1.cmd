python -m distfl train experiments/foundation/adapt.yaml model.lora.aggregate=stack seed=1 output.dir=experiments/foundation/runs/stack_r8_s1
