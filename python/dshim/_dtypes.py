"""torch dtype <-> dshim_dtype_t, torch ReduceOp <-> dshim_redop_t, and a
PREMUL_SUM factor as the scalar dshim_scale_mul takes.

Only reductions need a real element type.  Collectives that only move data
(broadcast, all_gather, all_to_all, gather, scatter, send/recv) carry every
torch dtype as bytes (DSHIM_UINT8, count * itemsize).
"""
import ctypes

import torch
from torch.distributed import ReduceOp

# dshim_dtype_t (include/dshim.h)
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, FLOAT8_E4M3, FLOAT8_E5M2 = range(12)
BYTES = UINT8

# dshim_redop_t
SUM, PROD, MIN, MAX, AVG = range(5)

_DTYPES = {
    torch.int8: INT8,
    torch.uint8: UINT8,
    torch.int32: INT32,
    torch.int64: INT64,
    torch.float16: FLOAT16,
    torch.bfloat16: BFLOAT16,
    torch.float32: FLOAT32,
    torch.float64: FLOAT64,
    torch.bool: UINT8,   # 0/1 bytes; ops are remapped to logical ones below
}
for _name, _code in (("uint32", UINT32), ("uint64", UINT64), ("float8_e4m3fn", FLOAT8_E4M3),
                     ("float8_e5m2", FLOAT8_E5M2)):
    if hasattr(torch, _name):   # newer torch only
        _DTYPES[getattr(torch, _name)] = _code

# complex numbers are pairs of reals; only element-wise linear ops stay exact
_COMPLEX_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}

_RT = ReduceOp.RedOpType
_OPS = {_RT.SUM: SUM, _RT.PRODUCT: PROD, _RT.MIN: MIN, _RT.MAX: MAX, _RT.AVG: AVG}
_OP_NAMES = {SUM: "SUM", PROD: "PRODUCT", MIN: "MIN", MAX: "MAX", AVG: "AVG"}
# bool: SUM/MAX = logical or, PRODUCT/MIN = logical and.  Gloo sums the bytes
# (True + True stores byte 2); the truth values are the same, but dshim keeps
# every byte 0 or 1, as torch expects of a bool tensor.
_BOOL_OPS = {_RT.SUM: MAX, _RT.MAX: MAX, _RT.BOR: MAX, _RT.PRODUCT: MIN, _RT.MIN: MIN, _RT.BAND: MIN}


def op_name(op):
    return _OP_NAMES.get(op, str(op))


def unpack_op(op):
    """(RedOpType, premul factor or None) from whatever torch hands a process group:
    a ReduceOp object (options), a RedOpType (ReduceOp.SUM), or None (= SUM)."""
    if op is None:
        return _RT.SUM, None
    if isinstance(op, _RT):
        return op, None
    kind = getattr(op, "op", None)
    if kind is None:
        raise RuntimeError(f"dshim: cannot interpret reduction op {op!r}")
    factor = None
    if kind == _RT.PREMUL_SUM:
        # the factor (a float or a tensor) is reachable only through the pickle state
        state = op.__getstate__()
        factor = state[1] if isinstance(state, tuple) and len(state) > 1 else None
        if factor is None:
            raise RuntimeError("dshim: ReduceOp.PREMUL_SUM without a factor")
    return kind, factor


def _unsupported(kind):
    name = str(kind).split(".")[-1]
    return RuntimeError(f"dshim: ReduceOp.{name} is not supported; use SUM/PRODUCT/MIN/MAX/AVG")


def dshim_dtype(dtype, what):
    code = _DTYPES.get(dtype)
    if code is None:
        raise RuntimeError(f"dshim: {what}: dtype {dtype} cannot be reduced by dshim; supported: "
                           "float32, float64, float16, bfloat16, float8_e4m3fn, float8_e5m2, int8, uint8, "
                           "int32, int64, uint32, uint64, bool, complex64/128 (SUM/AVG)")
    return code


def reduction(dtype, kind, what):
    """(dshim dtype, dshim op, real dtype to view the data as or None) for a
    reduction of `dtype` with RedOpType `kind` (PREMUL_SUM arrives here as SUM)."""
    if kind == _RT.PREMUL_SUM:
        kind = _RT.SUM
    view = None
    if dtype in _COMPLEX_REAL:
        if kind not in (_RT.SUM, _RT.AVG):
            raise RuntimeError(f"dshim: {what}: ReduceOp.{str(kind).split('.')[-1]} is not defined on complex "
                               f"numbers; use SUM or AVG")
        view = _COMPLEX_REAL[dtype]
        dtype = view
    if dtype == torch.bool:
        if kind == _RT.AVG:
            raise RuntimeError(f"dshim: {what}: ReduceOp.AVG is not defined on bool tensors")
        op = _BOOL_OPS.get(kind)
        if op is None:
            raise _unsupported(kind)
        return UINT8, op, None
    op = _OPS.get(kind)
    if op is None:
        raise _unsupported(kind)
    return dshim_dtype(dtype, what), op, view


# PREMUL_SUM's factor for dshim_scale_mul, which multiplies by a value of the
# tensor's own dtype (the reduction backend's scale_mul, as NCCL's PreMulSum)
_SCALAR_CTYPES = {INT8: ctypes.c_int8, UINT8: ctypes.c_uint8, INT32: ctypes.c_int32, UINT32: ctypes.c_uint32,
                  INT64: ctypes.c_int64, UINT64: ctypes.c_uint64, FLOAT32: ctypes.c_float, FLOAT64: ctypes.c_double}
_NARROW = {FLOAT16: (torch.int16, ctypes.c_uint16), BFLOAT16: (torch.int16, ctypes.c_uint16),
           FLOAT8_E4M3: (torch.uint8, ctypes.c_uint8), FLOAT8_E5M2: (torch.uint8, ctypes.c_uint8)}
_INT64_RANGE = range(-2 ** 63, 2 ** 63)


def premul_scalar(dtype, factor):
    """(dshim dtype, ctypes scalar) for scaling a tensor of torch `dtype` by a
    PREMUL_SUM `factor` with dshim_scale_mul, or None where torch's mul_ must do
    it (complex and bool tensors, factors of another type).

    dshim's result has torch's bits exactly when the factor is a value of the
    dtype: torch's mul_ by a Python number multiplies integers by the number
    wrapped to the integer type, float32/float64 by the number rounded to
    float32/float64, and float16/bfloat16 (widened to float32) by the number
    rounded to float32 -- dshim rounds it to the narrow type, the same only when
    that loses nothing (0.5, 0.25, 2, ...; 1/3 in bfloat16 is not).  A tensor
    factor counts when it holds one element of the same dtype."""
    if dtype == torch.bool or dtype in _COMPLEX_REAL:
        return None
    code = _DTYPES.get(dtype)
    if code is None:
        return None
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1 or factor.dtype != dtype:
            return None
        factor = factor.item()
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        return None
    if isinstance(factor, int) and factor not in _INT64_RANGE:
        return None   # torch refuses it too
    if code in (FLOAT32, FLOAT64, FLOAT16, BFLOAT16, FLOAT8_E4M3, FLOAT8_E5M2):
        if isinstance(factor, int) and abs(factor) > 2 ** 53:
            return None   # torch converts the integer straight to float32; Python goes through a double
        factor = float(factor)
    elif isinstance(factor, float):
        return None   # an integer tensor times a float: torch's mul_ raises, as it should
    if code in _SCALAR_CTYPES:
        return code, _SCALAR_CTYPES[code](factor)
    # narrow floats: torch's float32 factor, and the same value in the narrow type
    as_bits, ctype = _NARROW[code]
    f32 = torch.tensor(factor, dtype=torch.float32)
    narrow = f32.to(dtype)
    if not bool(narrow.float() == f32):
        return None
    return code, ctype(int(narrow.view(as_bits).item()) & (0xFFFF if ctype is ctypes.c_uint16 else 0xFF))
