python -m distfl train experiments/foundation/pretrain.yaml seed=0 output.dir=experiments/foundation/runs/pretrain_s0
