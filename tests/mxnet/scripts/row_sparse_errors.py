"""row_sparse use that dshim's parameter server refuses (one line naming the call), and a dense
weight with row_sparse gradients, which it carries (ps-lite's servers crash on it).
Usage: python row_sparse_errors.py OUT --case worker|mixed|async|embedding [--sparse-grad 0|1]
  worker:    refusals on the worker; the job goes on after each and ends well
  mixed:     worker 0 pushes a key dense, worker 1 row_sparse: the server refuses, the job fails
  async:     dist_async, a row_sparse push without an optimizer on the servers: the job fails
  embedding: nn.Embedding(sparse_grad=...) + Dense, plain SGD on the servers; writes the weights
"""
import argparse
import os

import numpy as np
import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--case", required=True)
p.add_argument("--sparse-grad", type=int, default=1)
args = p.parse_args()

kv = mx.kv.create("dist_async" if args.case == "async" else "dist_sync")
rank = kv.rank


def refused(what, needle, fn, *a, **kw):
    try:
        fn(*a, **kw)
    except mx.MXNetError as e:
        msg = str(e)
        assert needle in msg, (what, msg)
        print("worker %d: %s refused: %s" % (rank, what, msg.strip().splitlines()[-1][:300]))
        return
    raise AssertionError(what + " was not refused")


if args.case == "worker":
    kv.init(1, mx.nd.ones((4, 3)).tostype("row_sparse"))
    kv.init(2, mx.nd.ones((301, 5)))  # dense, 1505 >= the bound of 1000: split by elements over 3 servers,
    # at 502 and 1003, not at the rows 100 and 201 (elements 500, 1005)
    bad = mx.nd.sparse.row_sparse_array((mx.nd.ones((2, 3)), mx.nd.array([3, 1], dtype="int64")), shape=(4, 3))
    refused("unsorted rows", "not ascending", kv.push, 1, bad)
    refused("row id out of range", "outside its 4 rows", kv.row_sparse_pull, 1,
            out=mx.nd.zeros((4, 3), stype="row_sparse"), row_ids=mx.nd.array([0, 4]))
    refused("rows of a dense key split by elements", "initialise it with a row_sparse array", kv.push, 2,
            mx.nd.ones((301, 5)).tostype("row_sparse"))
    refused("csr init", "csr", kv.init, 3, mx.nd.ones((2, 2)).tostype("csr"))
    refused("row_sparse into a dense pull", "row_sparse_pull", kv.pushpull, 1, mx.nd.ones((4, 3)).tostype(
        "row_sparse"), out=mx.nd.zeros((4, 3)))
    # a dense pull of row_sparse keys gives every row, also of one sliced over the servers by rows
    # (ps-lite fails that: "The value size cannot be changed")
    kv.init(4, (mx.nd.arange(0, 1500).reshape((300, 5)) * 0).tostype("row_sparse"))
    kv.push(4, mx.nd.sparse.row_sparse_array((mx.nd.ones((2, 5)) * (rank + 1), mx.nd.array([7, 250], dtype="int64")),
                                             shape=(300, 5)))
    val = mx.nd.zeros((300, 5))
    kv.pull(4, out=val)
    want = np.zeros((300, 5), dtype="float32")
    want[[7, 250]] = 3  # no optimizer on the servers: the key is the sum of the pushes
    assert np.array_equal(val.asnumpy(), want), val
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    refused("compressed row_sparse", "Gradient compression for row sparse", kv.push, 1,
            mx.nd.ones((4, 3)).tostype("row_sparse"))
    refused("compressed row_sparse init", "Gradient compression for row sparse", kv.init, 5,
            mx.nd.ones((4, 3)).tostype("row_sparse"))
    # still a working job: pulls of what was initialised
    out = mx.nd.zeros((4, 3), stype="row_sparse")
    kv.row_sparse_pull(1, out=out, row_ids=mx.nd.array([2]))
    assert np.array_equal(out.asnumpy(), np.array([[0] * 3, [0] * 3, [1] * 3, [0] * 3], dtype="float32"))
    print("worker %d: done" % rank)
elif args.case == "mixed":
    kv.init(1, mx.nd.ones((4, 3)))
    v = mx.nd.ones((4, 3)) * (rank + 1)
    kv.push(1, v if rank == 0 else v.tostype("row_sparse"))
    kv.pull(1, out=mx.nd.zeros((4, 3)))
elif args.case == "async":
    kv.init(1, mx.nd.ones((4, 3)).tostype("row_sparse"))
    kv.push(1, mx.nd.ones((4, 3)).tostype("row_sparse"))
    kv.row_sparse_pull(1, out=mx.nd.zeros((4, 3), stype="row_sparse"), row_ids=mx.nd.array([0]))
elif args.case == "embedding":
    net = mx.gluon.nn.Sequential()
    with net.name_scope():
        net.add(mx.gluon.nn.Embedding(30, 6, sparse_grad=bool(args.sparse_grad)))
        net.add(mx.gluon.nn.Dense(3))
    mx.random.seed(7)
    net.initialize(mx.init.Xavier(rnd_type="uniform"), ctx=mx.cpu(0))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv,
                               update_on_kvstore=True)
    rng = np.random.RandomState(40 + rank)
    for _ in range(4):
        tokens = mx.nd.array(rng.randint(0, 30, size=(4, 2)))
        with mx.autograd.record():
            loss = net(tokens).sum()
        loss.backward()
        trainer.step(1)
    params = {k.split("_", 1)[-1]: v.data().asnumpy() for k, v in net.collect_params().items()}
    np.savez(os.path.join(args.out, "params_rank%d.npz" % rank), **params)
    print("worker %d: done" % rank)
