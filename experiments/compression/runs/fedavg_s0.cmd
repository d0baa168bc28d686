python -m distfl train experiments/compression/fmnist.yaml seed=0 train.rounds=50 output.dir=experiments/compression/runs/fedavg_s0 
