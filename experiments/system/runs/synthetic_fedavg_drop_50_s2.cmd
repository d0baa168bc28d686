python -m distfl train experiments/system/synthetic_stragglers.yaml seed=2 output.dir=experiments/system/runs/synthetic_fedavg_drop_50_s2 system.stragglers=0.5 train.rounds=200
