"""Soak job (MXNet): dist_sync pushpull loop whose every result is checked.

    dshim-run -n 2 -s 2 .venv-mxnet/bin/python mx_job.py OUT --steps 30 [--sleep 0.02]
No optimizer: a dist_sync server sums the workers' pushes, so pull = sum.  Step s: worker r pushes
(r+1)*(s+1) + arange(n) % 5 for 3 keys (one large enough to be split over both servers); the pulled
value must be exactly W*(W+1)/2*(s+1) + W*(arange % 5).  Worker r writes OUT/ready_worker<r> (its
pid) after its first step and OUT/ok_worker<r> at the end; exits 3 on a wrong result.
"""
import argparse
import os
import sys
import time

import numpy as np
import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--steps", type=int, default=30)
p.add_argument("--sleep", type=float, default=0.02)
args = p.parse_args()

kv = mx.kv.create("dist_sync")
rank, nw = kv.rank, kv.num_workers
shapes = {3: (17,), 5: (64, 33), 9: (300000,)}   # key 9: 1.2 MB, above MXNet's bigarray bound
pat = {k: (np.arange(int(np.prod(s))) % 5).reshape(s).astype(np.float32) for k, s in shapes.items()}
for k, s in shapes.items():
    kv.init(k, mx.nd.zeros(s))
for step in range(args.steps):
    for k, s in shapes.items():
        v = mx.nd.array(pat[k] + (rank + 1) * (step + 1))
        out = mx.nd.zeros(s)
        kv.pushpull(k, v, out=out)
        got = out.asnumpy()
        want = pat[k] * nw + nw * (nw + 1) // 2 * (step + 1)
        if not np.array_equal(got, want):
            i = int(np.argmax((got != want).ravel()))
            print("worker %d step %d key %d: WRONG pushpull result at %d: %r, want %r"
                  % (rank, step, k, i, got.ravel()[i], want.ravel()[i]), file=sys.stderr, flush=True)
            sys.exit(3)
    if step == 0:
        open(os.path.join(args.out, "ready_worker%d" % rank), "w").write(str(os.getpid()))
    if args.sleep:
        time.sleep(args.sleep)
open(os.path.join(args.out, "ok_worker%d" % rank), "w").write("ok")
print("worker %d of %d: %d pushpull steps correct" % (rank, nw, args.steps), flush=True)
