"""A dist_sync job whose workers disagree on a key's shape: every worker inits key 0 with
(4 + rank, 3) (rank 0's value is the one pushed) and then pushes that shape (--api pushpull or
push: kv.push then kv.pull).  The job must fail naming the mismatch: which worker pushed which
shape.  Usage: python shape_mismatch.py OUT [--api pushpull|push]"""
import argparse
import os

import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--api", default="pushpull", choices=["pushpull", "push"])
args = p.parse_args()

kv = mx.kv.create("dist_sync")
rank = kv.rank
with open(os.path.join(args.out, "pid_worker%d" % rank), "w") as f:
    f.write(str(os.getpid()))
shape = (4 + rank, 3)
kv.init(0, mx.nd.zeros(shape))
out = mx.nd.zeros(shape)
for step in range(3):
    g = mx.nd.ones(shape)
    if args.api == "pushpull":
        kv.pushpull(0, g, out=out)
    else:
        kv.push(0, g)
        kv.pull(0, out=out)
    print("worker %d step %d: %s" % (rank, step, out.asnumpy().ravel()[:3]), flush=True)
