python -m distfl train experiments/compression/fmnist.yaml seed=1 train.rounds=50 output.dir=experiments/compression/runs/qsgd8_s1 compression.up=qsgd compression.bits=8
