python -m distfl train experiments/fedprox_synthetic/configs/synthetic_0.5_0.5.yaml seed=0 train.rounds=200 output.dir=runs/fedprox_synthetic/synthetic_0.5_0.5_fedavg_s0
