"""A dist_sync job in which one worker stops pushing (the servers must name which worker has
not pushed which key to which server).

Every step, each worker pushes keys 0..K-1 in order and waits for each answer; at step
--stall-step, worker --stall-rank stops just before pushing key --stall-key: it sleeps
(--mode sleep: alive, never pushes again) or stops itself with SIGSTOP (--mode stop); or
(--mode barrier) at that step every worker calls kv._barrier() but that one, which sleeps.
--api pushpull (kv.pushpull, MXNet's engine: what Gluon's Trainer uses) or push (kv.push
then kv.pull: the synchronous path).  Rounds: the init is round 0, step s is round s + 1.
--kvtype dist_async: the servers answer each push at once (an SGD optimizer on them), so the
other workers run to their end and wait in the final barrier.
Usage: python stall_push.py OUT [--keys K] [--steps N] [--stall-step S] [--stall-key K]
       [--stall-rank R] [--mode sleep|stop] [--api pushpull|push] [--kvtype dist_sync|dist_async]
"""
import argparse
import os
import signal
import time

import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--keys", type=int, default=6)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--stall-step", type=int, default=3)
p.add_argument("--stall-key", type=int, default=3)
p.add_argument("--stall-rank", type=int, default=1)
p.add_argument("--mode", default="sleep", choices=["sleep", "stop", "barrier"])
p.add_argument("--api", default="pushpull", choices=["pushpull", "push"])
p.add_argument("--kvtype", default="dist_sync", choices=["dist_sync", "dist_async"])
args = p.parse_args()

kv = mx.kv.create(args.kvtype)
if args.kvtype == "dist_async":
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
rank = kv.rank
with open(os.path.join(args.out, "pid_worker%d" % rank), "w") as f:
    f.write(str(os.getpid()))
shape = (4, 3)
for k in range(args.keys):
    kv.init(k, mx.nd.zeros(shape))
w = [mx.nd.zeros(shape) for _ in range(args.keys)]
for step in range(args.steps):
    if args.mode == "barrier" and step == args.stall_step:
        if rank == args.stall_rank:
            print("worker %d skips the barrier of step %d" % (rank, step), flush=True)
            time.sleep(3600)
        kv._barrier()  # MXNet's Python name for MXKVStoreBarrier
    for k in range(args.keys):
        if rank == args.stall_rank and step == args.stall_step and k == args.stall_key and args.mode != "barrier":
            print("worker %d stops pushing at step %d before key %d" % (rank, step, k), flush=True)
            if args.mode == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(3600)
        g = mx.nd.ones(shape) * (rank + 1)
        if args.api == "pushpull":
            kv.pushpull(k, g, out=w[k])
        else:
            kv.push(k, g)
            kv.pull(k, out=w[k])
        w[k].wait_to_read()
print("worker %d done: %s" % (rank, w[0].asnumpy()[0]), flush=True)
