"""horovod.mxnet on dshim (python/dshim/_horovod/horovod/mxnet) with real MXNet 1.9.1 (.venv-mxnet)
and real processes, started as users start them: `.venv-mxnet/bin/horovodrun -np N python THIS_FILE
SCENARIO` (dshim's horovodrun, dshim-run underneath).

This file is both the test (pytest in .venv, which has no MXNet) and the ranks' program (run as a
script by .venv-mxnet's python).  Scenarios:
- train (2 ranks): a Gluon model whose first layer is initialised late (deferred), given every
  rank's own seed, made equal by hvd.broadcast_parameters before its first forward pass, trained
  with hvd.DistributedTrainer on each rank's own batches, ends with the parameters of the same
  model trained in one process on the concatenated batches (allclose), on every rank; once with
  one allreduce per gradient, once with num_groups=2, once with gluon.Trainer over
  hvd.DistributedOptimizer;
- ops (2 and 3 ranks): every operation's values against values computed from every rank's
  deterministic input;
- refusals (one process, no launcher): what Horovod refuses at enqueue (dtype, sparse storage, a root
  outside the set, bad alltoall splits, a scalar reducescatter, an operation after shutdown);
- mismatch (2 ranks): an allreduce whose shape differs between ranks raises MXNetError on every
  rank, naming the operation, and the next operation works.
Each rank prints "RESULT <scenario> ok" at the end; the test wants one per rank.  The job is
killed (its process group) after its time limit.

Skips (exit 77 from ctest's command, docs/testing.md) without .venv-mxnet or its horovodrun.
Run: .venv/bin/python -m pytest -q tests/horovod/test_hvd_mxnet.py
"""
import os
import pathlib
import signal
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve()
REPO = HERE.parents[2]
MX_PY = REPO / ".venv-mxnet" / "bin" / "python"
HOROVODRUN = MX_PY.parent / "horovodrun"
BUILD = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
TIMEOUT = 120


# ---- the ranks' program ----------------------------------------------------------------------------

def _batch(step, r, rows=6, cols=5):
    import numpy as np
    rs = np.random.RandomState(1000 * step + r)
    return rs.uniform(-1, 1, (rows, cols)).astype("float32"), rs.uniform(-1, 1, (rows, 1)).astype("float32")


def _model(seed):
    import mxnet as mx
    from mxnet import gluon
    mx.random.seed(seed)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(7, activation="tanh"), gluon.nn.Dense(1, in_units=7))   # first: in_units deferred
    net.initialize(mx.init.Uniform(0.5))
    return net


def _params(net):
    """The values of net's parameters in the order of its layers (gluon names them per instance)."""
    return [p.data().asnumpy().copy() for p in net.collect_params().values()]


def _train(net, trainer, batches):
    import mxnet as mx
    loss_fn = mx.gluon.loss.L2Loss()
    for x, y in batches:
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(x.shape[0])


def scenario_train(hvd):
    import mxnet as mx
    import numpy as np
    from mxnet import gluon
    r, n = hvd.rank(), hvd.size()
    steps = 4
    for variant in ("per_gradient", "groups", "fp16", "optimizer"):
        net = _model(seed=100 + r)   # every rank its own initial values
        hvd.broadcast_parameters(net.collect_params(), root_rank=0, prefix=variant)
        net(mx.nd.zeros((1, 5)))     # deferred initialisation: the broadcast happens now
        start = _params(net)
        first = hvd.allgather(mx.nd.array(start[0]).expand_dims(0), name=f"{variant}.start")
        assert all(np.array_equal(first[i].asnumpy(), start[0]) for i in range(n)), \
            f"{variant}: broadcast_parameters left the deferred parameter different between ranks"
        opt = dict(learning_rate=0.2, momentum=0.5)
        batches = [_batch(s, r) for s in range(steps)]
        if variant == "optimizer":
            # Horovod's DistributedOptimizer as the Module API uses it: update() per parameter, the
            # average carried by rescale_grad (1/local batch, times 1/size by the wrapper)
            dopt = hvd.DistributedOptimizer(mx.optimizer.SGD(rescale_grad=1.0 / batches[0][0].shape[0], **opt))
            params = list(net.collect_params().values())
            states = [dopt.create_state(i, p.data()) for i, p in enumerate(params)]
            for x, y in batches:
                with mx.autograd.record():
                    loss = gluon.loss.L2Loss()(net(mx.nd.array(x)), mx.nd.array(y))
                loss.backward()
                for i, p in enumerate(params):
                    dopt.update(i, p.data(), p.grad(), states[i])
        else:
            trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", opt, prefix=variant,
                                             num_groups=2 if variant == "groups" else 0,
                                             compression=hvd.Compression.fp16 if variant == "fp16" else
                                             hvd.Compression.none)
            _train(net, trainer, batches)

        # the same model, from the same start, in one process on every rank's batches together
        ref = _model(seed=0)
        ref(mx.nd.zeros((1, 5)))
        for p, value in zip(ref.collect_params().values(), start):
            p.set_data(mx.nd.array(value))
        ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", opt, kvstore=None)
        whole = []
        for s in range(steps):
            parts = [_batch(s, q) for q in range(n)]
            whole.append((np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])))
        _train(ref, ref_trainer, whole)
        got, want = _params(net), _params(ref)
        for k in range(len(want)):
            # fp16 compression: the gradients travel with 11 significant bits
            tol = dict(rtol=1e-2, atol=1e-3) if variant == "fp16" else dict(rtol=1e-5, atol=1e-6)
            assert np.allclose(got[k], want[k], **tol), \
                f"{variant}: rank {r}: parameter {k} after training differs from one process on all batches: " \
                f"max |diff| {np.abs(got[k] - want[k]).max()}"
            assert not np.allclose(got[k], start[k]), f"{variant}: parameter {k} did not change"


def _inputs(r, shape, dtype):
    import numpy as np
    return (np.arange(int(np.prod(shape))).reshape(shape) % 7 + r + 1).astype(dtype)


def scenario_ops(hvd):
    import mxnet as mx
    import numpy as np
    r, n = hvd.rank(), hvd.size()
    every = lambda shape, dtype: [_inputs(q, shape, dtype) for q in range(n)]   # noqa: E731
    for dtype in ("float32", "float64", "int32", "int64", "float16", "uint8", "int8"):
        shape = (3, 4)
        x = mx.nd.array(_inputs(r, shape, dtype), dtype=dtype)
        all_x = every(shape, dtype)
        total = sum(a.astype("float64") for a in all_x)
        got = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{dtype}").asnumpy()
        assert np.array_equal(got, total.astype(dtype)), (dtype, got, total)
        assert np.array_equal(x.asnumpy(), _inputs(r, shape, dtype)), "allreduce modified its input"
        for op, ref in ((hvd.Min, np.minimum.reduce(all_x)), (hvd.Max, np.maximum.reduce(all_x)),
                        (hvd.Product, np.prod(np.stack(all_x), axis=0))):
            got = hvd.allreduce(x, op=op, name=f"op{op}.{dtype}").asnumpy()
            assert np.array_equal(got, ref.astype(dtype)), (dtype, op, got, ref)
        if dtype.startswith("float"):
            got = hvd.allreduce(x, name=f"avg.{dtype}").asnumpy()   # Average is the default
            assert np.allclose(got, total / n, rtol=1e-3), (dtype, got)
            got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name=f"scale.{dtype}")
            assert np.allclose(got.asnumpy(), total * 1.5, rtol=1e-3), (dtype, got)
        y = x.copy()
        assert hvd.allreduce_(y, op=hvd.Sum, name=f"inplace.{dtype}") is y
        assert np.array_equal(y.asnumpy(), total.astype(dtype))
        root = n - 1
        got = hvd.broadcast(x, root_rank=root, name=f"bcast.{dtype}")
        assert np.array_equal(got.asnumpy(), all_x[root]) and np.array_equal(x.asnumpy(), all_x[r])
        rows = [q + 1 for q in range(n)]   # a different first dimension on every rank
        g = hvd.allgather(mx.nd.array(_inputs(r, (rows[r], 2), dtype), dtype=dtype), name=f"gather.{dtype}")
        assert np.array_equal(g.asnumpy(), np.concatenate([_inputs(q, (rows[q], 2), dtype) for q in range(n)]))
        assert g.dtype == np.dtype(dtype)
    # grouped
    xs = [mx.nd.array(_inputs(r, (i + 2,), "float32")) for i in range(3)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grouped")
    for i, o in enumerate(outs):
        assert np.array_equal(o.asnumpy(), sum(_inputs(q, (i + 2,), "float32") for q in range(n)))
    hvd.grouped_allreduce_(xs, op=hvd.Sum, name="grouped_")
    assert np.array_equal(xs[2].asnumpy(), outs[2].asnumpy())
    gs = hvd.grouped_allgather([mx.nd.array(_inputs(r, (2, 3), "int32"), dtype="int32")] * 2, name="ggather")
    assert all(g.shape == (2 * n, 3) for g in gs)
    # alltoall: splits[q] rows to rank q, received splits say how many rows came from each
    splits = [q + 1 for q in range(n)]
    t = mx.nd.array(np.repeat(np.arange(n) + 10 * r, splits).astype("float32"))
    out, received = hvd.alltoall(t, splits=splits, name="a2a")
    assert received.asnumpy().tolist() == [r + 1] * n, received
    assert out.asnumpy().tolist() == [float(r + 10 * q) for q in range(n) for _ in range(r + 1)], out
    even = hvd.alltoall(mx.nd.arange(2 * n) + 100 * r, name="a2a.even")
    assert even.asnumpy().tolist() == [float(2 * r + k + 100 * q) for q in range(n) for k in range(2)]
    # reducescatter: rank q gets its share of the first dimension of the sum
    rs = hvd.reducescatter(mx.nd.array(_inputs(r, (2 * n, 3), "float32")), op=hvd.Sum, name="rs")
    full = sum(_inputs(q, (2 * n, 3), "float32") for q in range(n))
    assert np.array_equal(rs.asnumpy(), full[2 * r:2 * r + 2]), rs
    grs = hvd.grouped_reducescatter([mx.nd.array(_inputs(r, (2 * n, 3), "float32"))] * 2, op=hvd.Average,
                                    name="grs")
    assert all(np.allclose(g.asnumpy(), full[2 * r:2 * r + 2] / n) for g in grs)
    # objects
    assert hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=n - 1) == {"from": n - 1,
                                                                                    "list": [n - 1] * 3}
    assert hvd.allgather_object(("rank", r)) == [("rank", q) for q in range(n)]
    # a process set of the even ranks
    ps = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    if r % 2 == 0:
        got = hvd.allreduce(mx.nd.ones((2,)) * (r + 1), op=hvd.Sum, process_set=ps, name="ps")
        assert got.asnumpy().tolist() == [float(sum(q + 1 for q in range(0, n, 2)))] * 2, got
    hvd.remove_process_set(ps)


def scenario_mismatch(hvd):
    import mxnet as mx
    from mxnet.base import MXNetError
    r = hvd.rank()
    try:
        hvd.allreduce(mx.nd.ones((3 + r, 2)), name="mismatched").wait_to_read()
        raise AssertionError(f"rank {r}: an allreduce of shapes differing between ranks did not raise")
    except MXNetError as e:
        msg = str(e)
        assert "mismatched" in msg, msg
        assert isinstance(e, hvd.HorovodMXNetError), type(e)
        print(f"rank {r} raised: {msg.splitlines()[0]}", flush=True)
    got = hvd.allreduce(mx.nd.ones((2,)), op=hvd.Sum, name="after")
    assert got.asnumpy().tolist() == [float(hvd.size())] * 2, got


def scenario_refusals(hvd):
    """One process without a launcher (a job of one rank): what Horovod refuses at enqueue raises
    MXNetError naming the operation, and the next operation works."""
    import mxnet as mx
    from mxnet.base import MXNetError
    cases = [
        ("Unsupported tensor type bool", lambda: hvd.allreduce(mx.nd.ones((2,), dtype="bool"))),
        ("row_sparse NDArray is not supported", lambda: hvd.allreduce(mx.nd.ones((2, 2)).tostype("row_sparse"))),
        ("invalid root rank 3", lambda: hvd.broadcast(mx.nd.ones((2,)), root_rank=3)),
        ("32-bit integer", lambda: hvd.alltoall(mx.nd.ones((2,)), splits=mx.nd.ones((1,)))),
        ("Sum of splits entries (5)", lambda: hvd.alltoall(mx.nd.ones((2,)), splits=[5])),
        ("Number of entries in splits (2)", lambda: hvd.alltoall(mx.nd.ones((2,)), splits=[1, 1])),
    ]
    for text, call in cases:
        try:
            call()
            raise AssertionError(f"not refused: {text}")
        except MXNetError as e:
            assert text in str(e) and "horovod.mxnet rank 0" in str(e), (text, str(e))
    try:
        hvd.reducescatter(mx.nd.array(1, dtype="float32"))
        raise AssertionError("reducescatter of a scalar not refused")
    except ValueError as e:
        assert "scalar" in str(e), e
    assert hvd.allreduce(mx.nd.ones((2,)) * 3, op=hvd.Sum).asnumpy().tolist() == [3.0, 3.0]
    hvd.shutdown()
    try:
        hvd.allreduce(mx.nd.ones((2,)))
        raise AssertionError("an operation after hvd.shutdown() was not refused")
    except MXNetError as e:
        assert "Horovod has not been initialized" in str(e), e
    hvd.init()


def rank_main(scenario):
    import horovod
    import horovod.mxnet as hvd
    assert getattr(horovod, "__dshim__", False), horovod.__file__
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.init()
    globals()["scenario_" + scenario](hvd)
    hvd.shutdown()
    print(f"RESULT {scenario} ok", flush=True)


# ---- the test --------------------------------------------------------------------------------------

def _run(scenario, np_, launcher=True):
    import pytest
    if not MX_PY.exists() or not HOROVODRUN.exists():
        pytest.skip(f"no {MX_PY} with dshim's horovodrun: run make setup")
    if not (BUILD / "lib" / "libdshim.so").exists():
        pytest.skip(f"no {BUILD}/lib/libdshim.so: run make")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DSHIM_", "HOROVOD_", "OMPI_", "PMI_", "SLURM_", "TORCHELASTIC_"))
           and k not in ("PYTHONPATH", "LD_PRELOAD", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                         "MASTER_PORT")}
    if "DSHIM_TRACE_DIR" in os.environ:
        env["DSHIM_TRACE_DIR"] = os.environ["DSHIM_TRACE_DIR"]
    env.update(PATH=f"{MX_PY.parent}:{env.get('PATH', '')}", PYTHONDONTWRITEBYTECODE="1", DSHIM_TIMEOUT="60",
               OMP_NUM_THREADS="1")
    cmd = [str(MX_PY), str(HERE), scenario]
    if launcher:
        cmd = [str(HOROVODRUN), "-np", str(np_), "-H", f"localhost:{np_}"] + cmd
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{scenario} at {np_} ranks did not finish in {TIMEOUT} s:\n{out[-6000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-6000:]
    assert out.count(f"RESULT {scenario} ok") == np_, out[-6000:]
    return out


def test_training_equals_one_process_on_all_batches():
    _run("train", 2)


def test_ops_values_2_ranks():
    _run("ops", 2)


def test_ops_values_3_ranks():
    _run("ops", 3)


def test_refusals_in_one_process():
    _run("refusals", 1, launcher=False)


def test_shape_mismatch_raises_on_every_rank():
    out = _run("mismatch", 2)
    assert out.count(" raised: ") == 2, out


if __name__ == "__main__":
    rank_main(sys.argv[1])
