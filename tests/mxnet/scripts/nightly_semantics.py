"""The semantics MXNet 1.9.1's tests/nightly/dist_sync_kvstore.py and dist_async_kvstore.py check,
one --type at a time (the same names), written here (not a copy): each case checks the values it
expects itself, and worker r writes what it saw to OUT/params_rank<r>.npz, so that a run under
ps-lite and one under dshim can be compared too.  Sizes are smaller than upstream's (the job runs
with MXNET_KVSTORE_BIGARRAY_BOUND=1000, so "big" keys are still sliced over every server).
Usage: python nightly_semantics.py OUT --type TYPE [--nrepeat N]
"""
import argparse
import os

import numpy as np
import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--type", required=True)
p.add_argument("--nrepeat", type=int, default=3)
args = p.parse_args()

kv = mx.kv.create("dist_async" if args.type == "dist_async" else "dist_sync")
rank, nw = kv.rank, kv.num_workers
seen = {}  # what this worker saw: name -> array, compared between ps-lite and dshim
RATE = 2
SHAPE = (4, 3)
BIG = (60, 25)  # 1500 elements >= the job's bound of 1000: sliced by rows over the servers


def record(name, value):
    seen[name] = value.asnumpy() if isinstance(value, mx.nd.NDArray) else np.asarray(value)


def expect_equal(name, got, want):
    got = got.asnumpy() if isinstance(got, mx.nd.NDArray) else np.asarray(got)
    want = want.asnumpy() if isinstance(want, mx.nd.NDArray) else np.asarray(want)
    assert got.shape == want.shape and np.array_equal(got, want), (name, rank, got, want)
    record(name, got)


def raises(name, exc, fn, *a, **kw):
    """The call must raise exc; records its one-line message's first words for the log."""
    try:
        fn(*a, **kw)
    except exc as e:
        print("worker %d: %s raised %s: %s" % (rank, name, type(e).__name__, str(e).splitlines()[0][:200]))
        record(name, 1)
        return
    raise AssertionError("%s did not raise %s" % (name, exc.__name__))


def rsp_pull(key, out, row_ids):
    kv.row_sparse_pull(key, out=out, row_ids=row_ids)
    return out


def rows_of(full, ids):
    """full's rows at ids, every other row 0 (what a row_sparse_pull returns)."""
    want = np.zeros_like(full)
    want[np.unique(ids)] = full[np.unique(ids)]
    return want


def case_default():
    dtypes = ["float16", "float32"]
    for d, dt in enumerate(dtypes):
        kv.init("dense%d" % d, mx.nd.ones(SHAPE, dtype=dt))
        kv.init("dbig%d" % d, mx.nd.ones(BIG, dtype=dt))
        kv.init("rsp%d" % d, mx.nd.ones(SHAPE, dtype=dt).tostype("row_sparse"))
        kv.init("rzero%d" % d, mx.nd.ones(SHAPE, dtype=dt).tostype("row_sparse"))
        kv.init("rbig%d" % d, mx.nd.ones(BIG, dtype=dt).tostype("row_sparse"))
    kv.set_optimizer(mx.optimizer.create("test", rescale_grad=RATE, multi_precision=True))
    for d, dt in enumerate(dtypes):
        # dense: every worker pushes rank+1; the servers' "test" optimizer adds RATE * the sum
        for k, s in (("dense%d" % d, SHAPE), ("dbig%d" % d, BIG)):
            for i in range(args.nrepeat):
                kv.push(k, mx.nd.ones(s, dtype=dt) * (rank + 1))
                val = mx.nd.zeros(s, dtype=dt)
                kv.pull(k, out=val)
                expect_equal("%s_%d" % (k, i), val, np.full(s, (nw + 1) * nw * RATE / 2 * (i + 1) + 1, dtype=dt))
        # row_sparse: worker r updates row r % rows; pulls of random (duplicate, unsorted) row ids
        k = "rsp%d" % d
        v = mx.nd.zeros(SHAPE, dtype=dt)
        v[rank % SHAPE[0]] = rank + 1
        rng = np.random.RandomState(10 + rank)
        for i in range(args.nrepeat):
            kv.push(k, v.tostype("row_sparse"))
            ids = rng.randint(SHAPE[0], size=SHAPE[0])
            out = rsp_pull(k, mx.nd.zeros(SHAPE, stype="row_sparse", dtype=dt),
                           mx.nd.array(ids).reshape((SHAPE[0] // 2, 2)).astype(dt))
            full = np.ones(SHAPE, dtype=dt)
            for r in range(nw):
                full[r % SHAPE[0]] += (r + 1) * RATE * (i + 1)
            expect_equal("%s_%d" % (k, i), out, rows_of(full, ids))
            assert np.array_equal(out.indices.asnumpy(), np.unique(ids)), (out.indices, ids)
            # one row id array for several outputs (Python copies the first)
            outs = [mx.nd.zeros(SHAPE, stype="row_sparse", dtype=dt) for _ in range(2)]
            kv.row_sparse_pull(k, out=outs, row_ids=mx.nd.array(ids[::-1]))
            for j, o in enumerate(outs):
                expect_equal("%s_%d_out%d" % (k, i, j), o, rows_of(full, ids))
        # pushes without rows change nothing; pulls of every row / of none
        for k, s in (("rzero%d" % d, SHAPE), ("rbig%d" % d, BIG)):
            for i in range(args.nrepeat):
                kv.push(k, mx.nd.sparse.zeros("row_sparse", s, dtype=dt))
                out = rsp_pull(k, mx.nd.sparse.zeros("row_sparse", s, dtype=dt), mx.nd.array(np.arange(s[0])))
                expect_equal("%s_all_%d" % (k, i), out, np.ones(s, dtype=dt))
                out = rsp_pull(k, out, mx.nd.array([]))
                expect_equal("%s_none_%d" % (k, i), out, np.zeros(s, dtype=dt))
                assert out.indices.shape == (0,)
                # into a float32 output whatever the key's dtype (MXNet casts), as upstream's test does
                out = rsp_pull(k, mx.nd.sparse.zeros("row_sparse", s), mx.nd.array(np.arange(s[0])))
                expect_equal("%s_all_f32_%d" % (k, i), out, np.ones(s, dtype="float32"))
        # a key sliced over the servers: every worker updates its own subset of a random 30%
        k = "rbig%d" % d
        sample = np.random.RandomState(123).rand(BIG[0])
        chosen = np.argwhere(sample < 0.3).flatten()
        rows_by = [chosen[::(r + 1) * 2] for r in range(nw)]
        v = mx.nd.zeros(BIG, dtype=dt)
        for row in rows_by[rank]:
            v[int(row)] = rank + 1
        rng = np.random.RandomState(rank)
        for i in range(args.nrepeat):
            kv.push(k, v.tostype("row_sparse"))
            ids = rng.randint(BIG[0], size=BIG[0])
            out = rsp_pull(k, mx.nd.zeros(BIG, stype="row_sparse", dtype=dt),
                           mx.nd.array(ids).reshape((BIG[0] // 2, 2)).astype(dt))
            full = np.ones(BIG, dtype=dt)
            for r in range(nw):
                for row in rows_by[r]:
                    full[row] += (r + 1) * RATE * (i + 1)
            expect_equal("%s_%d" % (k, i), out, rows_of(full, ids))


def case_gluon_sparse_step():
    # dist_sync_kvstore.py's check: a row_sparse weight with a row_sparse gradient, SGD on the servers
    shape = (2, 10)
    all_rows = mx.nd.arange(0, shape[0])
    x = mx.gluon.Parameter("x", shape=shape, stype="row_sparse", grad_stype="row_sparse")
    x.initialize(ctx=mx.cpu(0), init="ones")
    trainer = mx.gluon.Trainer([x], "sgd", {"learning_rate": 1.0}, kvstore=kv)
    with mx.autograd.record():
        y = (rank + 1) * x.row_sparse_data(all_rows)
        y.backward()
    trainer.step(1)
    expect_equal("x", x.row_sparse_data(all_rows), np.full(shape, 1 - (1 + nw) * nw / 2, dtype="float32"))


def case_gluon_sparse_model():
    # (not upstream's) a SparseEmbedding (a row_sparse weight, gradients of the looked-up rows only) and a dense
    # layer, a few steps of SGD with momentum on the servers; then params.save of both.  (A dense
    # weight with sparse_grad, nn.Embedding(sparse_grad=True), crashes ps-lite's servers:
    # "copying size mismatch"; dshim carries it, see test_nightly_semantics.py)
    net = mx.gluon.nn.Sequential()
    with net.name_scope():
        net.add(mx.gluon.contrib.nn.SparseEmbedding(20, 6))
        net.add(mx.gluon.nn.Dense(3))
    mx.random.seed(7)
    net.initialize(mx.init.Xavier(rnd_type="uniform"), ctx=mx.cpu(0))
    params = net.collect_params()
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kv)
    rng = np.random.RandomState(40 + rank)
    for _ in range(3):
        tokens = mx.nd.array(rng.randint(0, 20, size=(4, 2)))
        with mx.autograd.record():
            loss = net(tokens).sum()
        loss.backward()
        trainer.step(1)
    fname = os.path.join(args.out, "saved_rank%d.params" % rank)
    params.save(fname)
    for name, value in sorted(mx.nd.load(fname).items()):
        record("saved_" + name.split("_", 1)[-1], value.tostype("default"))


def case_gluon_step():
    shape = (10, 1)
    x = mx.gluon.Parameter("x", shape=shape)
    x.initialize(ctx=mx.cpu(0), init="ones")
    trainer = mx.gluon.Trainer([x], "sgd", {"learning_rate": 1.0, "multi_precision": False}, kvstore=kv)
    with mx.autograd.record():
        y = (rank + 1) * x.data(mx.cpu(0))
        y.backward()
    trainer.step(1)
    expect_equal("x", x.data(mx.cpu(0)), np.full(shape, 1 - (1 + nw) * nw / 2, dtype="float32"))


def trainer_kv_type(stype, grad_stype, update_on_kv):
    params = mx.gluon.ParameterDict()
    params.get("x", shape=(10, 1), lr_mult=1.0, stype=stype, grad_stype=grad_stype)
    params.initialize(ctx=[mx.cpu(0), mx.cpu(1)], init="zeros")
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv, update_on_kvstore=update_on_kv)
    try:
        trainer._init_kvstore()
    except ValueError:
        return "ValueError"
    assert trainer._kv_initialized
    return str(trainer._update_on_kvstore)


def case_gluon_type():
    combos = [("default", "default", None, "True"), ("default", "default", True, "True"),
              ("default", "default", False, "False"), ("default", "row_sparse", None, "True"),
              ("default", "row_sparse", False, "ValueError"), ("row_sparse", "row_sparse", None, "True"),
              ("row_sparse", "row_sparse", False, "ValueError")]
    for i, (stype, gstype, upd, want) in enumerate(combos):
        got = trainer_kv_type(stype, gstype, upd)
        assert got == want, (stype, gstype, upd, got, want)
        record("combo%d" % i, [got == "True", got == "False", got == "ValueError"])


def case_async():
    # dist_async_kvstore.py: with an async kvstore the Trainer always updates on the kvstore
    for i, stype in enumerate(["default", "row_sparse"]):
        for j, upd in enumerate([False, True, None]):
            params = mx.gluon.ParameterDict()
            params.get("x", shape=(10, 1), lr_mult=1.0, stype=stype)
            params.initialize(ctx=[mx.cpu(0), mx.cpu(1)], init="zeros")
            try:
                trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv,
                                           update_on_kvstore=upd)
                trainer._init_kvstore()
                assert trainer._kv_initialized and trainer._update_on_kvstore is True
                got = 1
            except ValueError:
                assert upd is False
                got = 0
            record("trainer_%d_%d" % (i, j), got)


def case_invalid():
    # a Trainer updating on the kvstore cannot be reset by params.load
    params = mx.gluon.ParameterDict()
    x = params.get("x", shape=(4, 2), lr_mult=1.0, stype="row_sparse")
    params.initialize(ctx=mx.cpu(0), init="zeros")
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv)
    fname = os.path.join(args.out, "reset_rank%d.params" % rank)
    params.save(fname)
    expect_equal("x", x.row_sparse_data(mx.nd.arange(0, 4)), np.zeros((4, 2), dtype="float32"))
    assert trainer._kv_initialized and trainer._update_on_kvstore
    mx.nd.waitall()
    raises("reset", RuntimeError, params.load, fname)
    # a dist kvstore pulls dense only (ignore_sparse=False is refused), and no unknown key
    kv.init(999, mx.nd.ones((2, 2)).tostype("row_sparse"))
    raises("pull_sparse", mx.MXNetError, kv.pull, 999, out=mx.nd.ones((2, 2)).tostype("row_sparse"),
           ignore_sparse=False)
    raises("pull_unknown", mx.MXNetError, kv.pull, "invalid_key", out=mx.nd.ones((2, 2)).tostype("row_sparse"),
           ignore_sparse=False)
    # what neither carries: a csr push, a row_sparse pushpull, a row_sparse_pull into a dense array
    kv.init(998, mx.nd.ones((3, 4)))
    raises("push_csr", mx.MXNetError, kv.push, 998, mx.nd.ones((3, 4)).tostype("csr"))
    raises("pushpull_rsp", mx.MXNetError, kv.pushpull, 999, mx.nd.ones((2, 2)).tostype("row_sparse"),
           out=mx.nd.zeros((2, 2)).tostype("row_sparse"))
    raises("rsp_pull_dense", mx.MXNetError, kv.row_sparse_pull, 999, out=mx.nd.zeros((2, 2)),
           row_ids=mx.nd.array([0]))
    # a pull with ignore_sparse=True leaves a row_sparse output as it is
    out = mx.nd.ones((2, 2)).tostype("row_sparse") * 7
    kv.pull(999, out=out)
    expect_equal("ignored", out, np.full((2, 2), 7, dtype="float32"))
    # the job still works: a row_sparse_pull of the key initialised above
    expect_equal("after", rsp_pull(999, mx.nd.zeros((2, 2), stype="row_sparse"), mx.nd.array([1])),
                 np.array([[0, 0], [1, 1]], dtype="float32"))


def case_init():
    # dist_sync_kvstore.py's test_sync_init (CPU): init then pull, float32 and float16 keys
    for tag, shape in (("small", SHAPE), ("big", BIG)):
        for i in range(6):
            dt = "float32" if i < 3 else "float16"
            key = "init_%s_%d" % (tag, i)
            kv.init(key, [mx.nd.ones(shape, dtype=dt) * i])
            val = mx.nd.zeros(shape, dtype=dt)
            kv.pull(key, out=val)
            expect_equal(key, val, np.full(shape, i, dtype=dt))


def case_compressed():
    # dist_sync_kvstore.py's test_sync_2bit_compression, smaller
    threshold = 0.5
    kv.set_gradient_compression({"type": "2bit", "threshold": threshold})
    shapes = [("c1", SHAPE), ("c2", (31, 31)), ("c3", BIG)]
    for k, s in shapes:
        kv.init(k, mx.nd.zeros(s))
        kv.init(k + "i", mx.nd.ones(s))
    kv.set_optimizer(mx.optimizer.create("test", rescale_grad=RATE))

    def pulled(k, s, name, want):
        val = mx.nd.zeros(s)
        kv.pull(k, out=val)
        expect_equal(name, val, np.full(s, want, dtype="float32"))
    for k, s in shapes:
        pulled(k, s, k + "_start", 0)
        pulled(k + "i", s, k + "i_start", 1)  # init is not compressed
        kv.push(k, mx.nd.zeros(s))
        pulled(k, s, k + "_zero", 0)
        kv.push(k, mx.nd.ones(s) * 0.4)  # below the threshold: kept as residual
        pulled(k, s, k + "_r1", 0)
        kv.push(k, mx.nd.ones(s) * (threshold - 0.4))  # the residual reaches it
        cur = threshold * RATE * nw
        pulled(k, s, k + "_r2", cur)
        kv.push(k, mx.nd.ones(s) * 0.2)
        pulled(k, s, k + "_r3", cur)
        kv.push(k, mx.nd.ones(s) * (threshold - 0.2))
        cur += threshold * RATE * nw
        pulled(k, s, k + "_r4", cur)
    rng = np.random.RandomState(123)  # the same gradients on every worker
    for k, s in shapes:
        kv.init(k + "r", mx.nd.zeros(s))
        for i in range(args.nrepeat):
            kv.push(k + "r", mx.nd.array(rng.rand(*s)))
            val = mx.nd.zeros(s)
            kv.pull(k + "r", out=val)
            record("%sr_%d" % (k, i), val)


CASES = {"default_cpu": case_default, "gluon_sparse_step_cpu": case_gluon_sparse_step,
         "gluon_sparse_model_cpu": case_gluon_sparse_model, "gluon_step_cpu": case_gluon_step, "gluon_type_cpu": case_gluon_type, "invalid_cpu": case_invalid,
         "init_gpu": case_init, "compressed_cpu": case_compressed, "dist_async": case_async}
CASES[args.type]()
kv._barrier()
np.savez(os.path.join(args.out, "params_rank%d.npz" % rank), **seen)
print("worker %d passed %s (%d values)" % (rank, args.type, len(seen)))
