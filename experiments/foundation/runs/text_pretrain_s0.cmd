python -m distfl train experiments/foundation/text_pretrain.yaml seed=0 output.dir=experiments/foundation/runs/text_pretrain_s0
