"""What ``sarc train`` runs on one process and on P workers alike: the training loop
(``loop``: epochs of steps from a step source, gradients and counts reduced over the
workers), the model's inputs as the hyperparameters ask (``inputs``) and the workers'
optimizer (``optim``: torch's Adam without torch's compiler). The trainers
around it, ``sarc.train`` (a dataset) and ``sarc.distributed.train`` (a worker's shard),
load their data, build the model and report."""
