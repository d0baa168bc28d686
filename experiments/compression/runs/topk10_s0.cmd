python -m distfl train experiments/compression/fmnist.yaml seed=0 train.rounds=50 output.dir=experiments/compression/runs/topk10_s0 compression.up=topk compression.density=0.1
