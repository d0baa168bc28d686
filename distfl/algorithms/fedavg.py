"""FedAvg (McMahan et al. 2017): local SGD, then the sample-weighted (or uniform) mean of the client
models. With `server.optimizer` other than plain sgd/lr 1 this is FedAvgM / FedAdam / FedYogi /
FedAdagrad (Reddi et al. 2021): the server optimizer acts on the mean update."""
from .base import Algorithm


class FedAvg(Algorithm):
    name = "fedavg"
    tct_stage1 = True
    private_release = True
    asynchronous = True
