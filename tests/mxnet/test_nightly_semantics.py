"""MXNet 1.9.1's nightly dist kvstore tests (tests/nightly/dist_sync_kvstore.py --type=..., and
dist_async_kvstore.py), as our own checks of the same semantics (scripts/nightly_semantics.py):
every type runs under MXNet's ps-lite (dshim-run --no-preload) and under dshim; both must pass
their own checks, and what the workers saw must be equal, bit for bit."""
import numpy as np
import pytest

from mxjob import PY, RUN, launch, load_params

pytestmark = pytest.mark.timeout(300)

if not PY.exists() or not RUN.exists():
    pytest.skip("needs .venv-mxnet (make setup) and a build", allow_module_level=True)

# "big" keys of 1500 elements are sliced over the servers, as upstream's 1200x1200 ones
SMALL_BOUND = {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}
TYPES = {
    "default_cpu": SMALL_BOUND,
    "gluon_sparse_step_cpu": {},
    "gluon_sparse_model_cpu": {},  # ours: SparseEmbedding + Dense, momentum SGD, params.save
    "gluon_step_cpu": {},
    "gluon_type_cpu": {},
    "invalid_cpu": {},
    "init_gpu": SMALL_BOUND,  # on the CPU (upstream: --no-gpu)
    "compressed_cpu": SMALL_BOUND,
    "dist_async": {},
}


@pytest.mark.parametrize("kind", list(TYPES))
def test_nightly_type(tmp_path, kind):
    ns = 3 if kind == "default_cpu" else 2  # 3 servers: a sliced key's rows split unevenly
    out = {}
    for name, dshim in (("pslite", False), ("dshim", True)):
        log = launch("nightly_semantics.py", tmp_path / name, "--type", kind, dshim=dshim, ns=ns,
                     env=TYPES[kind], timeout=240)
        assert log.count("passed " + kind) == 2, log[-4000:]
        out[name] = load_params(tmp_path / name)
    for r in range(2):
        a, b = out["pslite"][r], out["dshim"][r]
        assert sorted(a) == sorted(b), (sorted(a), sorted(b))
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (r, k, a[k], b[k])
