python -m distfl train experiments/fedprox_synthetic/configs/synthetic_iid.yaml seed=0 train.rounds=200 output.dir=runs/fedprox_synthetic/synthetic_iid_fedavg_s0
