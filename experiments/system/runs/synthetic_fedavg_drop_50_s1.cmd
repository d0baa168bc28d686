python -m distfl train experiments/system/synthetic_stragglers.yaml seed=1 output.dir=experiments/system/runs/synthetic_fedavg_drop_50_s1 system.stragglers=0.5 train.rounds=200
