"""A user's script with 2-bit gradient compression on a dist_sync kvstore.

MXNet 1.9.1 refuses compression with pushpull (what Trainer and Module use), so
this loop pushes gradients and pulls weights itself, with the optimizer on the
servers.  Worker r writes its final parameters to OUT/params_rank<r>.npz.
Usage: python twobit_push_pull.py OUT [--threshold T] [--steps N] [--server-opt 0|1]
"""
import argparse
import os

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--threshold", type=float, default=0.05)
p.add_argument("--steps", type=int, default=15)
p.add_argument("--server-opt", type=int, default=1)
p.add_argument("--in-units", type=int, default=40)
args = p.parse_args()

kv = mx.kv.create("dist_sync")
kv.set_gradient_compression({"type": "2bit", "threshold": args.threshold})
rank = kv.rank

mx.random.seed(11)
net = gluon.nn.Dense(3, in_units=args.in_units)
net.initialize(mx.init.Normal(0.1))
params = list(net.collect_params().values())
for i, prm in enumerate(params):
    kv.init(i, prm.data())
if args.server_opt:
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, rescale_grad=1.0 / 32))
for i, prm in enumerate(params):
    kv.pull(i, out=prm.data())

rng = np.random.RandomState(300 + rank)
x = mx.nd.array(rng.randn(32, args.in_units))
y = mx.nd.array(rng.randn(32, 3))
loss_fn = gluon.loss.L2Loss()
for step in range(args.steps):
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    for i, prm in enumerate(params):
        kv.push(i, prm.grad())
    for i, prm in enumerate(params):
        if args.server_opt:
            kv.pull(i, out=prm.data())
        else:
            g = mx.nd.zeros_like(prm.grad())
            kv.pull(i, out=g)
            prm.data()[:] -= 0.1 / 64 * g
print("worker %d: final loss %.6f" % (rank, loss.mean().asscalar()), flush=True)
np.savez(os.path.join(args.out, "params_rank%d.npz" % rank),
         **{"p%d" % i: prm.data().asnumpy() for i, prm in enumerate(params)})
