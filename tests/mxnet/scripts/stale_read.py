"""A dist kvstore job whose server 1 is stopped (SIGSTOP) after step 1: step 2's result must not
be read as if it were fresh.  Each worker does step 1 (the call, then the first read of its
result), writes OUT/step1_rank<R>, waits for OUT/go (the test stops the server, then writes it),
does step 2 into an output filled with -7, reads it, and writes OUT/result_rank<R>: the line
"raised at <call|read>" and MXNet's message, or "value <first elements>" when nothing raised.
Then it sleeps until the test kills it (a worker that ended would be announced as dead to the
other, which may still be waiting for the stopped server).
--api pushpull (kv.pushpull), push (kv.push then kv.pull), rows (kv.push of a row_sparse
gradient then kv.row_sparse_pull); --twobit: 2-bit gradient compression; --big: one key of
16 M floats (64 MiB), whose push cannot all go out to a stopped server.
Usage: python stale_read.py OUT [--kvtype dist_sync|dist_async] [--api ...] [--twobit] [--big]
"""
import argparse
import os
import time

import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--kvtype", default="dist_sync")
p.add_argument("--api", default="pushpull", choices=["pushpull", "push", "rows"])
p.add_argument("--twobit", action="store_true")
p.add_argument("--big", action="store_true")
args = p.parse_args()

kv = mx.kv.create(args.kvtype)
rank = kv.rank
with open(os.path.join(args.out, "pid_worker%d" % rank), "w") as f:
    f.write(str(os.getpid()))
if args.kvtype == "dist_async":
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5))  # an async kvstore needs the servers' optimizer
if args.twobit:
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
# MXNET_KVSTORE_BIGARRAY_BOUND (set by the test) is below every key's size: each key is split
# over both servers, so every call needs the stopped one
shape = (1 << 24,) if args.big else (64, 4)
if args.api == "rows":
    kv.init(3, mx.nd.zeros(shape).tostype("row_sparse"))
else:
    kv.init(3, mx.nd.zeros(shape))


def step():
    g = mx.nd.ones(shape) * (rank + 1)
    if args.api == "rows":
        out = (mx.nd.ones(shape) * -7).tostype("row_sparse")
        ids = mx.nd.array(list(range(shape[0])), dtype="int64")
    else:
        out = mx.nd.ones(shape) * -7
    out.wait_to_read()
    where = "call"
    try:
        if args.api == "pushpull":
            kv.pushpull(3, g, out=out)
        elif args.api == "push":
            kv.push(3, g)
            kv.pull(3, out=out)
        else:
            kv.push(3, g.tostype("row_sparse"))
            kv.row_sparse_pull(3, out=out, row_ids=ids)
        where = "read"
        return "value %s" % out.asnumpy().ravel()[:4].tolist()
    except mx.base.MXNetError as e:
        return "raised at %s\n%s" % (where, e)


first = step()
with open(os.path.join(args.out, "step1_rank%d" % rank), "w") as f:
    f.write(first)
print("worker %d step 1: %s" % (rank, first), flush=True)
deadline = time.time() + 120
while not os.path.exists(os.path.join(args.out, "go")) and time.time() < deadline:
    time.sleep(0.05)
second = step()
with open(os.path.join(args.out, "result_rank%d.tmp" % rank), "w") as f:
    f.write(second)
os.rename(os.path.join(args.out, "result_rank%d.tmp" % rank), os.path.join(args.out, "result_rank%d" % rank))
print("worker %d step 2: %s" % (rank, second), flush=True)
time.sleep(600)
