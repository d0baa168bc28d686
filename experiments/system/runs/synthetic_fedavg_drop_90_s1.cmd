python -m distfl train experiments/system/synthetic_stragglers.yaml seed=1 output.dir=experiments/system/runs/synthetic_fedavg_drop_90_s1 system.stragglers=0.9
