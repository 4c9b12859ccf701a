"""A user's float16 weights on a dist_sync kvstore, SGD with momentum on the servers.

With a float32 master copy on the servers (kSetMultiPrecision, sent for an optimizer with
multi_precision=True), pushes are summed in float32, the optimizer updates the float32 copy and
pulls return it cast to float16; without one, updates under half a float16 ulp are lost.
Worker r writes its final parameters to OUT/params_rank<r>.npz.
Usage: python multi_precision.py OUT [--steps N] [--opt-first 0|1] [--multi-precision 0|1]
"""
import argparse
import os

import numpy as np
import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--opt-first", type=int, default=0, help="set the optimizer before kv.init (else after)")
p.add_argument("--multi-precision", type=int, default=1, help="the optimizer's multi_precision")
args = p.parse_args()

kv = mx.kv.create("dist_sync")
rank = kv.rank
opt = mx.optimizer.SGD(learning_rate=0.01, momentum=0.9, multi_precision=bool(args.multi_precision),
                       rescale_grad=0.5)
shapes = [(50,), (7, 11)]
rng0 = np.random.RandomState(5)
weights = [mx.nd.array(1.0 + rng0.rand(*s), dtype="float16") for s in shapes]  # ulp 2^-10 near 1..2
if args.opt_first:
    kv.set_optimizer(opt)
for i, w in enumerate(weights):
    kv.init(i, w)
if not args.opt_first:
    kv.set_optimizer(opt)
for i, w in enumerate(weights):
    kv.pull(i, out=w)

rng = np.random.RandomState(100 + rank)
for step in range(args.steps):
    # small gradients: each step moves a weight by well under one float16 ulp
    grads = [mx.nd.array(rng.randn(*s) * 0.01, dtype="float16") for s in shapes]
    for i, g in enumerate(grads):
        kv.push(i, g)
    for i, w in enumerate(weights):
        kv.pull(i, out=w)
mx.nd.waitall()
print("worker %d: done, %s, multi_precision=%s" % (rank, [w.dtype.__name__ for w in weights], opt.multi_precision), flush=True)
np.savez(os.path.join(args.out, "params_rank%d.npz" % rank),
         **{"p%d" % i: w.asnumpy() for i, w in enumerate(weights)})
