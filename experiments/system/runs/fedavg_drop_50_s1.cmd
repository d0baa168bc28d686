python -m distfl train experiments/system/fmnist_stragglers.yaml seed=1 output.dir=experiments/system/runs/fedavg_drop_50_s1 system.speed=list:1,1,1,1,1,3,5,7,9,11
