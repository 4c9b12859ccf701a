"""A user's Gluon training script, unmodified for dshim: Trainer with a dist kvstore.

Rank-dependent synthetic data; worker r writes its final parameters to OUT/params_rank<r>.npz.
Usage: python gluon_trainer.py OUT [--kvstore dist_sync] [--update-on-kvstore 0|1]
       [--steps N] [--hidden H] [--in-units D] [--sleep S]
"""
import argparse
import os
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--kvstore", default="dist_sync")
p.add_argument("--update-on-kvstore", type=int, default=1)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--hidden", type=int, default=16)
p.add_argument("--in-units", type=int, default=8)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--ndev", type=int, default=1, help="CPU contexts per worker (data split over them)")
args = p.parse_args()

kv = mx.kv.create(args.kvstore)
rank, nworkers = kv.rank, kv.num_workers
with open(os.path.join(args.out, "pid_worker%d" % rank), "w") as f:
    f.write(str(os.getpid()))

mx.random.seed(7)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(args.hidden, activation="relu", in_units=args.in_units))
net.add(gluon.nn.Dense(1, in_units=args.hidden))
ctx = [mx.cpu(i) for i in range(args.ndev)]
net.initialize(mx.init.Xavier(), ctx=ctx)

rng = np.random.RandomState(100 + rank)
x = mx.nd.array(rng.randn(64, args.in_units))
y = mx.nd.array(x.asnumpy().sum(axis=1, keepdims=True) * 0.5 + rank)

trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4},
                        kvstore=kv, update_on_kvstore=bool(args.update_on_kvstore))
loss_fn = gluon.loss.L2Loss()
xs = gluon.utils.split_and_load(x, ctx)
ys = gluon.utils.split_and_load(y, ctx)
for step in range(args.steps):
    with autograd.record():
        losses = [loss_fn(net(xi), yi) for xi, yi in zip(xs, ys)]
    for l in losses:
        l.backward()
    trainer.step(x.shape[0])
    if args.sleep:
        time.sleep(args.sleep)
print("worker %d of %d: final loss %.6f" % (rank, nworkers, sum(l.sum().asscalar() for l in losses) / x.shape[0]), flush=True)
params = {name: p.data(ctx[-1]).asnumpy() for name, p in net.collect_params().items()}
np.savez(os.path.join(args.out, "params_rank%d.npz" % rank), **params)
