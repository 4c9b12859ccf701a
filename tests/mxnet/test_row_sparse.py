"""row_sparse keys on dshim's parameter server beyond what ps-lite carries: what is refused (one
line naming the call, the job goes on, or fails at once when a server must refuse), and a dense
weight with row_sparse gradients (nn.Embedding(sparse_grad=True)), which crashes ps-lite's servers
("copying size mismatch") and which dshim carries with the dense run's parameters, bit for bit."""
import subprocess

import numpy as np
import pytest

from mxjob import PY, RUN, SCRIPTS, clean_env, free_port, launch, load_params

pytestmark = pytest.mark.timeout(300)

if not PY.exists() or not RUN.exists():
    pytest.skip("needs .venv-mxnet (make setup) and a build", allow_module_level=True)


def test_refused_on_the_worker(tmp_path):
    out = launch("row_sparse_errors.py", tmp_path, "--case", "worker", ns=3,
                 env={"MXNET_KVSTORE_BIGARRAY_BOUND": "1000"})
    assert out.count(": done") == 2, out[-3000:]
    for what in ("unsorted rows", "row id out of range", "rows of a dense key split by elements", "csr init",
                 "row_sparse into a dense pull", "compressed row_sparse", "compressed row_sparse init"):
        assert out.count(what + " refused") == 2, (what, out[-3000:])


@pytest.mark.parametrize("case,needle", [
    ("mixed", "every worker must push the key with the same storage type"),
    ("async", "Updater needs to be set for async mode"),
])
def test_refused_by_the_server(tmp_path, case, needle):
    cmd = [str(RUN), "--master-port", str(free_port()), "-n", "2", "-s", "1", str(PY), str(SCRIPTS / "row_sparse_errors.py"), str(tmp_path),
           "--case", case]
    p = subprocess.run(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    assert p.returncode != 0 and needle in p.stdout, p.stdout[-3000:]
    assert "Segmentation fault" not in p.stdout and "core dumped" not in p.stdout, p.stdout[-3000:]


def test_embedding_sparse_grad(tmp_path):
    """Plain SGD leaves rows without gradient as they are, so the sparse_grad=True run under dshim
    must equal the dense-gradient run under ps-lite."""
    launch("row_sparse_errors.py", tmp_path / "pslite", "--case", "embedding", "--sparse-grad", 0, dshim=False)
    launch("row_sparse_errors.py", tmp_path / "dshim", "--case", "embedding", "--sparse-grad", 1)
    a, b = load_params(tmp_path / "pslite"), load_params(tmp_path / "dshim")
    for r in range(2):
        assert sorted(a[r]) == sorted(b[r])
        for k in a[r]:
            assert np.array_equal(a[r][k], b[r][k]), (r, k, np.abs(a[r][k] - b[r][k]).max())
