python -m distfl train experiments/system/fmnist_heterogeneous.yaml seed=0 output.dir=experiments/system/runs/sync_s0 
