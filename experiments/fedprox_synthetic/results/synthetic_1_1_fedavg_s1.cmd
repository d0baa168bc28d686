python -m distfl train experiments/fedprox_synthetic/configs/synthetic_1_1.yaml seed=1 train.rounds=200 output.dir=runs/fedprox_synthetic/synthetic_1_1_fedavg_s1
