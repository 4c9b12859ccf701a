"""A user's Module API script, unmodified for dshim: mod.fit with a dist kvstore (string keys).

Worker r writes its final training loss to OUT/loss_rank<r>.txt.
Usage: python module_fit.py OUT [--kvstore dist_async] [--epochs N]
"""
import argparse
import logging
import os

import numpy as np
import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--kvstore", default="dist_async")
p.add_argument("--epochs", type=int, default=8)
args = p.parse_args()

kv = mx.kv.create(args.kvstore)
rank = kv.rank
logging.basicConfig(level=logging.WARNING)

rng = np.random.RandomState(200 + rank)
true_w = np.arange(1, 11, dtype=np.float32).reshape(10, 1) / 10.0
x = rng.randn(512, 10).astype(np.float32)
y = x.dot(true_w).reshape(-1)
train = mx.io.NDArrayIter(x, y, batch_size=32, shuffle=False, label_name="lin_reg_label")

data = mx.sym.Variable("data")
label = mx.sym.Variable("lin_reg_label")
fc = mx.sym.FullyConnected(data=data, num_hidden=1, name="fc")
net = mx.sym.LinearRegressionOutput(data=fc, label=label, name="lro")

mx.random.seed(3)
mod = mx.mod.Module(net, data_names=["data"], label_names=["lin_reg_label"], context=mx.cpu())
mod.fit(train, kvstore=kv, optimizer="sgd", optimizer_params={"learning_rate": 0.05},
        initializer=mx.init.Uniform(0.1), num_epoch=args.epochs, eval_metric="mse")
score = dict(mod.score(train, "mse"))["mse"]
print("worker %d: final mse %.6f" % (rank, score), flush=True)
with open(os.path.join(args.out, "loss_rank%d.txt" % rank), "w") as f:
    f.write("%.8f\n" % score)
