python -m distfl train experiments/fedprox_synthetic/configs/synthetic_1_1.yaml seed=0 train.rounds=200 output.dir=runs/fedprox_synthetic/synthetic_1_1_fedavg_s0
