python -m distfl train experiments/compression/fmnist.yaml seed=1 train.rounds=50 output.dir=experiments/compression/runs/topk1_s1 compression.up=topk compression.density=0.01
