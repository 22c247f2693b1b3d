"""What ``sarc train`` runs on one process and on P workers alike: the training loop
(``loop``: epochs of steps from a step source, gradients and counts reduced over the
workers) and the model's inputs as the hyperparameters ask (``inputs``). The trainers
around it, ``sarc.train`` (a dataset) and ``sarc.distributed.train`` (a worker's shard),
load their data, build the model and report."""
