python -m distfl train experiments/foundation/text_adapt.yaml train.rounds=1 eval.every=1 server.optimizer=sgd server.lr=1e-30 seed=0 output.dir=experiments/foundation/runs/text_base_s0
