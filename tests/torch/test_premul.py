"""PREMUL_SUM's local scaling through libdshim (dshim_scale_mul, the reduction
backend's scale_mul) gives the bits torch's own `mul_` gives, for every dtype
dshim reduces; factors it cannot take exactly stay on torch's mul_.

One process, a group of one rank ("dshim" over a HashStore): its all_reduce
returns the scaled input unchanged, so the result is the scaling alone.

Env: DSHIM_BUILD_DIR selects the build whose libdshim.so is loaded (default:
the checkout's build/).
"""
import ctypes
import datetime
import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"

torch = pytest.importorskip("torch")
if not LIB.exists():
    pytest.skip(f"{LIB} not built (run make)", allow_module_level=True)
ctypes.CDLL(str(LIB), mode=ctypes.RTLD_GLOBAL)   # the package uses the library already in the process
sys.path.insert(0, str(REPO / "python"))
import torch.distributed as dist  # noqa: E402
import dshim  # noqa: E402,F401  (registers the backend)
from dshim import _dtypes as D  # noqa: E402
from dshim import _lib  # noqa: E402

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
# float factors: exact in every float dtype, then ones the narrow types cannot hold
EXACT = [0.5, 0.25, 2.0, -1.5, 3.0, -4.0]
INEXACT = [1 / 3, 3.7, 1e-3, 0.1]
INT_FACTORS = [7, -3, 300, 0]   # as one-element tensors: _make_nccl_premul_sum takes a float or a tensor


@pytest.fixture(scope="module", autouse=True)
def group():
    dist.init_process_group("dshim", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def data(dtype, n=4099, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float64) * 100
        x[:9] = torch.tensor([0.0, -0.0, 1e-40, -1e-300, 6e4, -3e38, float("inf"), float("-inf"), float("nan")])
        return x.to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)


def bits(t):
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width)


def same_bits(got, want, what):
    assert got.dtype == want.dtype, what
    diff = (bits(got) != bits(want)).nonzero().flatten()
    assert diff.numel() == 0, (f"{what}: {diff.numel()} elements differ, first at {diff[0].item()}: "
                               f"{got[diff[0]].item()!r} vs torch {want[diff[0]].item()!r}")


def premul(f):
    return dist._make_nccl_premul_sum(f)


def cases():
    for dt in FLOATS:
        for f in EXACT + INEXACT:
            yield dt, f
        yield dt, torch.tensor([0.75], dtype=dt)   # a one-element factor of the same dtype
        yield dt, torch.tensor(0.3, dtype=torch.float64)   # another dtype: torch's mul_
    for dt in INTS:
        for f in INT_FACTORS:
            yield dt, torch.tensor([f], dtype=torch.int64).to(dt)
        yield dt, torch.tensor(5, dtype=dt)   # zero-dimensional


@pytest.mark.parametrize("dtype,factor", list(cases()), ids=lambda v: str(v).replace("torch.", ""))
def test_all_reduce_scaling_is_torchs_mul(dtype, factor):
    x = data(dtype)
    want = x.clone().mul_(factor)
    got = x.clone()
    dist.all_reduce(got, op=premul(factor))
    same_bits(got, want, f"all_reduce {dtype} x {factor!r}")


@pytest.mark.parametrize("dtype", INTS)
def test_integer_tensor_times_a_float_still_raises(dtype):
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(3, dtype=dtype).mul_(2.0)
    with pytest.raises(RuntimeError, match="can't be cast"):
        dist.all_reduce(torch.ones(3, dtype=dtype), op=premul(2.0))


def test_the_c_path_takes_what_it_can_take_exactly():
    """Which factors go through dshim_scale_mul: every float32/float64 factor,
    narrow floats only where the factor is a value of the narrow type, integer
    tensors only with integer factors."""
    for dt in (torch.float32, torch.float64):
        for f in EXACT + INEXACT:
            assert D.premul_scalar(dt, f) is not None, (dt, f)
    for dt in (torch.bfloat16, torch.float16):
        for f in EXACT:
            assert D.premul_scalar(dt, f) is not None, (dt, f)
        for f in INEXACT:
            assert D.premul_scalar(dt, f) is None, (dt, f)
    for dt in INTS:
        for f in INT_FACTORS:
            assert D.premul_scalar(dt, f) is not None, (dt, f)
        assert D.premul_scalar(dt, 0.5) is None, dt   # torch's mul_ raises, as before
    for dt in (torch.bool, torch.complex64, torch.complex128):
        assert D.premul_scalar(dt, 2.0) is None, dt
    assert D.premul_scalar(torch.float32, torch.tensor([2.0, 3.0])) is None
    assert D.premul_scalar(torch.float32, True) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_every_reduction_scales_like_torch(dtype):
    """reduce, reduce_scatter and reduce_scatter_tensor scale their own host copies."""
    f = torch.tensor([5], dtype=dtype) if not dtype.is_floating_point else 0.25
    x = data(dtype, n=1000, seed=1)
    want = x.clone().mul_(f)
    got = x.clone()
    dist.reduce(got, dst=0, op=premul(f))
    same_bits(got, want, "reduce")
    out = torch.empty_like(x)
    dist.reduce_scatter_tensor(out, x.clone(), op=premul(f))
    same_bits(out, want, "reduce_scatter_tensor")
    out = torch.empty_like(x)
    dist.reduce_scatter(out, [x.clone()], op=premul(f))
    same_bits(out, want, "reduce_scatter")


def test_complex_keeps_torchs_mul():
    z = torch.complex(data(torch.float32, n=64), data(torch.float32, n=64, seed=2))
    want = torch.view_as_real(z.clone()).mul_(0.5)
    got = z.clone()
    dist.all_reduce(got, op=premul(0.5))
    same_bits(torch.view_as_real(got), want, "complex64")


def world_comm():
    """The dshim_comm_t * of the group of one rank."""
    return dist.group.WORLD._comm.comm


def scale_mul(dtype_code, buf, scalar, comm):
    return _lib.lib().dshim_scale_mul(comm, buf.data_ptr(), buf.data_ptr(), buf.numel(), dtype_code,
                                      ctypes.byref(scalar))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_scaling(dtype):
    """torch has no mul_ for fp8 on the CPU: dshim's is float32's, rounded once."""
    x = (torch.rand(300, generator=torch.Generator().manual_seed(3)) * 8 - 4).to(dtype)
    code, value = D.premul_scalar(dtype, 0.5)
    got = x.clone()
    assert scale_mul(code, got, value, world_comm()) == _lib.OK
    same_bits(got, (x.float() * 0.5).to(dtype), str(dtype))


@pytest.mark.parametrize("dtype,code,ctype,width", [
    (torch.uint32, D.UINT32, ctypes.c_uint32, 32), (torch.uint64, D.UINT64, ctypes.c_uint64, 64)])
def test_unsigned_scaling_wraps(dtype, code, ctype, width):
    vals = [0, 1, 2 ** (width - 1) + 3, 2 ** width - 1]
    x = torch.tensor(vals, dtype=dtype)
    assert scale_mul(code, x, ctype(3), world_comm()) == _lib.OK
    assert [int(v) % 2 ** width for v in x.tolist()] == [v * 3 % 2 ** width for v in vals]


def test_scale_mul_refuses_bad_arguments():
    x = torch.ones(4)
    one = ctypes.c_float(1.0)
    assert scale_mul(D.FLOAT32, x, one, None) == _lib.ERR_INVALID
    assert "comm is NULL" in _lib.last_error()
    assert scale_mul(99, x, one, world_comm()) == _lib.ERR_INVALID
    assert "dtype 99" in _lib.last_error()
    lib = _lib.lib()
    assert lib.dshim_scale_mul(world_comm(), None, None, 4, D.FLOAT32, ctypes.byref(one)) == _lib.ERR_INVALID
    assert "dst is NULL" in _lib.last_error()
    assert lib.dshim_scale_mul(world_comm(), None, None, 0, D.FLOAT32, ctypes.byref(one)) == _lib.OK
