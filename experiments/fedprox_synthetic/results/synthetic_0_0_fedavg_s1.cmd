python -m distfl train experiments/fedprox_synthetic/configs/synthetic_0_0.yaml seed=1 train.rounds=200 output.dir=runs/fedprox_synthetic/synthetic_0_0_fedavg_s1
