"""dshim's 2-bit gradient compression (shim/ps/ps_twobit.*) against the real MXNet 1.9.1.

MXNet 1.9.1 registers no operator for its quantizer, so the test calls MXNet's own
mxnet::kvstore::GradientCompression (exported from libmxnet.so) through ctypes: the
constructor, SetTwoBitCompression, Quantize/Dequantize on real NDArrays (their C-API
handles are NDArray*), GetCompressedSize, EncodeParams/DecodeParams.  The user-facing
parameter check goes through MXKVStoreSetGradientCompression on a 'device' kvstore, and the
threshold MXNet parsed is read back by pushing +inf through it (it dequantizes to exactly
+threshold).

dshim's side is a test-only shared library (twobit_exact_shim.c) built here twice: linked
with build/lib/libdshim_core.a (the shipped objects), and the codec alone from source at
-O3 -march=native.

Run: .venv-mxnet/bin/python -m pytest -q tests/mxnet/test_twobit_exact.py
(DSHIM_BUILD_DIR selects the build directory, default <repo>/build).
"""
import ctypes
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("DSHIM_BUILD_DIR", REPO / "build"))
HERE = Path(__file__).resolve().parent

GC = "_ZN5mxnet7kvstore19GradientCompression"
SIZES = [1, 3, 15, 16, 17, 31, 33, 1000, 65537, 1 << 20]
THRESHOLDS = [0.5, 1e-3, 0.1, 3.0, 1e-30, 1e30]
CALLS = 6


# ---------------------------------------------------------------- MXNet's side


class MXNetTwoBit:
    """MXNet's GradientCompression object, driven through its exported C++ methods."""

    def __init__(self):
        lib = mx.base._LIB
        vp = ctypes.c_void_p

        def method(name, argtypes, restype=None):
            fn = getattr(lib, GC + name)
            fn.argtypes = argtypes
            fn.restype = restype
            return fn

        self._ctor = method("C1Ev", [vp])
        self._set = method("20SetTwoBitCompressionEf", [vp, ctypes.c_float])
        self._get_type = method("8get_typeEv", [vp], ctypes.c_int)
        self._quantize = method("8QuantizeERKNS_7NDArrayEPS2_S5_i", [vp, vp, vp, vp, ctypes.c_int])
        self._dequantize = method("10DequantizeERKNS_7NDArrayEPS2_i", [vp, vp, vp, ctypes.c_int])
        self._size = method("17GetCompressedSizeEl", [vp, ctypes.c_int64], ctypes.c_int64)
        self._encode = method("12EncodeParamsEv", [vp, vp], vp)   # (sret std::string, this)
        self._decode = method("12DecodeParamsERKSs", [vp, vp])    # old-ABI std::string
        libstdcxx = ctypes.CDLL("libstdc++.so.6")
        self._string_ctor = libstdcxx._ZNSsC1EPKcRKSaIcE          # string(const char*, alloc)
        self._string_ctor.argtypes = [vp, ctypes.c_char_p, vp]
        self._keep = []

    def new(self, threshold=None):
        obj = ctypes.create_string_buffer(256)   # the object is 16 bytes: vptr, type, float
        self._ctor(obj)
        if threshold is not None:
            self._set(obj, threshold)
        self._keep.append(obj)
        return obj

    def fields(self, obj):
        """(type, threshold) read from the object: layout checked by test_mxnet_layout."""
        return struct.unpack("<if", obj.raw[8:16])

    def get_type(self, obj):
        return self._get_type(obj)

    def quantize(self, obj, grad_nd, residual_nd, words):
        out = mx.nd.zeros(words, dtype="float32")
        self._quantize(obj, grad_nd.handle, out.handle, residual_nd.handle, 0)
        mx.nd.waitall()
        return out.asnumpy().view(np.uint32)

    def dequantize(self, obj, words_u32, n):
        src = mx.nd.array(words_u32.view(np.float32), dtype="float32")
        assert np.array_equal(src.asnumpy().view(np.uint32), words_u32)  # bits went in intact
        out = mx.nd.zeros(n, dtype="float32")
        self._dequantize(obj, src.handle, out.handle, 0)
        mx.nd.waitall()
        return out.asnumpy()

    def compressed_size(self, obj, n):
        return self._size(obj, n)

    def encode(self, obj):
        sret = ctypes.create_string_buffer(32)
        self._encode(sret, obj)
        return ctypes.c_char_p.from_buffer(sret).value.decode()   # COW string: char* first

    def decode(self, obj, text):
        s = ctypes.create_string_buffer(32)
        alloc = ctypes.create_string_buffer(8)
        self._string_ctor(s, text.encode(), alloc)
        self._keep.append(s)   # never destroyed: MXNet only reads it
        self._decode(obj, s)


def mxnet_set_params(kv, key, params):
    """MXKVStoreSetGradientCompression, then the threshold MXNet parsed (pushing +inf through
    a fresh key dequantizes to +threshold).  Returns (threshold, None) or (None, message)."""
    keys = [k for k, _ in params]
    vals = [v for _, v in params]
    rc = mx.base._LIB.MXKVStoreSetGradientCompression(
        kv.handle, mx.base.mx_uint(len(params)), mx.base.c_str_array(keys),
        mx.base.c_str_array(vals))
    if rc != 0:
        return None, mx.base.py_str(mx.base._LIB.MXGetLastError()).splitlines()[0]
    kv.init(key, mx.nd.zeros(16))
    kv.push(key, mx.nd.full(16, np.inf))
    out = mx.nd.zeros(16)
    kv.pull(key, out=out)
    return float(out.asnumpy()[0]), None


# ---------------------------------------------------------------- dshim's side


def build_shim(tmpdir, codec_only):
    src = HERE / "twobit_exact_shim.c"
    so = tmpdir / ("twobit_codec_native.so" if codec_only else "twobit_core.so")
    cmd = ["cc", "-std=gnu11", "-shared", "-fPIC", "-Wall", "-Werror",
           f"-I{REPO / 'include'}", f"-I{REPO / 'shim/ps'}", "-o", str(so)]
    if codec_only:
        cmd += ["-O3", "-march=native", "-DTWOBIT_CODEC_ONLY", str(src), str(REPO / "shim/ps/ps_twobit.c")]
    else:
        core = BUILD / "lib" / "libdshim_core.a"
        if not core.exists():
            pytest.fail(f"{core} is missing: build dshim first (make)")
        cmd += ["-O2", str(src), str(core), "-lunwind", "-lpthread", "-lm", "-lrt", "-ldl"]
    subprocess.run(cmd, check=True, timeout=120)
    lib = ctypes.CDLL(str(so))
    f32p = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
    u32p = np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS")
    lib.twobit_words.argtypes = [ctypes.c_size_t]
    lib.twobit_words.restype = ctypes.c_size_t
    lib.twobit_quantize.argtypes = [f32p, f32p, ctypes.c_size_t, ctypes.c_float, u32p]
    lib.twobit_quantize.restype = None
    lib.twobit_dequantize.argtypes = [u32p, ctypes.c_size_t, ctypes.c_float, f32p]
    lib.twobit_dequantize.restype = None
    if not codec_only:
        lib.twobit_parse.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_char_p),
                                     ctypes.POINTER(ctypes.c_char_p),
                                     ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int)]
        lib.twobit_encode_params.argtypes = [ctypes.c_int, ctypes.c_float, ctypes.c_char_p,
                                             ctypes.c_size_t]
        lib.twobit_decode_params.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_float),
                                             ctypes.POINTER(ctypes.c_int)]
        lib.twobit_server_threshold.argtypes = [ctypes.c_float]
        lib.twobit_server_threshold.restype = ctypes.c_float
        lib.twobit_last_error.restype = ctypes.c_char_p
    return lib


@pytest.fixture(scope="module")
def mxgc():
    return MXNetTwoBit()


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twobit")
    return {"core": build_shim(tmp, codec_only=False),
            "native": build_shim(tmp, codec_only=True)}


@pytest.fixture(scope="module")
def core(libs):
    return libs["core"]


def dshim_parse(lib, params):
    n = len(params)
    keys = (ctypes.c_char_p * max(n, 1))(*[k.encode() for k, _ in params])
    vals = (ctypes.c_char_p * max(n, 1))(*[v.encode() for _, v in params])
    t = ctypes.c_float(-1.0)
    enabled = ctypes.c_int(-1)
    rc = lib.twobit_parse(n, keys, vals, ctypes.byref(t), ctypes.byref(enabled))
    if rc != 0:
        return None, lib.twobit_last_error().decode()
    assert enabled.value == 1
    return t.value, None


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


# ---------------------------------------------------------------- data


def gradient(rng, n, t, call):
    """Normal values at a scale that changes per call, plus edge values: +-t exactly, one
    ulp either side, signed zeros, subnormals, huge values, and (rarely: they stick in the
    residual) NaN and +-inf."""
    t32 = np.float32(t)
    scale = [0.3, 1.0, 3.0][call % 3]
    x = (rng.standard_normal(n) * t * scale).astype(np.float32)
    edges = np.array([t32, -t32, np.nextafter(t32, 0), np.nextafter(-t32, 0),
                      np.nextafter(t32, np.inf), np.nextafter(-t32, -np.inf), 0.0, -0.0,
                      1e-40, -1e-40, 3e38, -3e38, t32 / 2, -t32 / 2], dtype=np.float32)
    mask = rng.random(n) < 0.15
    x[mask] = rng.choice(edges, int(mask.sum()))
    rare = rng.random(n) < 0.005
    x[rare] = rng.choice(np.array([np.nan, np.inf, -np.inf], dtype=np.float32), int(rare.sum()))
    return x


def same_floats(a, b):
    """Bit-equal, except that any NaN matches any NaN (the payload of a NaN made by inf-inf
    depends on operand order, which the compiler may swap)."""
    an, bn = np.isnan(a), np.isnan(b)
    if not np.array_equal(an, bn):
        return False
    return np.array_equal(a[~an].view(np.uint32), b[~bn].view(np.uint32))


# ---------------------------------------------------------------- tests


def test_mxnet_layout(mxgc):
    """The GradientCompression object holds (vptr, type, threshold) as fields() assumes."""
    fresh = mxgc.new()
    assert mxgc.get_type(fresh) == 0 and mxgc.fields(fresh) == (0, 0.0)
    obj = mxgc.new(0.5)
    assert mxgc.get_type(obj) == 1 and mxgc.fields(obj) == (1, 0.5)


def test_compressed_size(mxgc, core):
    obj = mxgc.new(0.5)
    for n in list(range(0, 100)) + [1 << 20, (1 << 31) + 5, (1 << 40) + 17]:
        assert core.twobit_words(n) == mxgc.compressed_size(obj, n), n


@pytest.mark.parametrize("variant", ["core", "native"])
@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_quantize_bit_exact(mxgc, libs, variant, threshold):
    """Packed words, residuals after each of CALLS calls, and dequantized values."""
    lib = libs[variant]
    t32 = float(np.float32(threshold))
    obj = mxgc.new(t32)
    rng = np.random.default_rng(2 * THRESHOLDS.index(threshold) + (variant == "native"))
    emitted = 0
    for n in SIZES:
        words = lib.twobit_words(n)
        mx_residual = mx.nd.zeros(n, dtype="float32")
        residual = np.zeros(n, dtype=np.float32)
        for call in range(CALLS):
            grad = gradient(rng, n, t32, call)
            mx_words = mxgc.quantize(obj, mx.nd.array(grad, dtype="float32"), mx_residual, words)
            out = np.full(words, 0xDEADBEEF, dtype=np.uint32)
            lib.twobit_quantize(grad, residual, n, t32, out)
            where = f"n={n} t={t32} call {call}"
            diff = np.nonzero(out != mx_words)[0]
            assert diff.size == 0, f"{where}: word {diff[:1]}: dshim {out[diff[:1]]} mxnet {mx_words[diff[:1]]}"
            assert same_floats(residual, mx_residual.asnumpy()), f"{where}: residuals differ"
            mx_deq = mxgc.dequantize(obj, mx_words, n)
            deq = np.empty(n, dtype=np.float32)
            lib.twobit_dequantize(out, n, t32, deq)
            assert same_floats(deq, mx_deq), f"{where}: dequantized values differ"
            emitted += int(np.count_nonzero(deq))
    assert emitted > 100000   # the data did cross the threshold, both ways


@pytest.mark.parametrize("variant", ["core", "native"])
def test_dequantize_any_bits(mxgc, libs, variant):
    """Random words, so also the code 01 that quantize never writes (MXNet reads it as 0)."""
    lib = libs[variant]
    rng = np.random.default_rng(7)
    for n in [1, 16, 17, 4099, 100000]:
        words = rng.integers(0, 1 << 32, lib.twobit_words(n), dtype=np.uint64).astype(np.uint32)
        for t in [0.5, 2.0, 1e-20]:
            t32 = float(np.float32(t))
            mx_deq = mxgc.dequantize(mxgc.new(t32), words, n)
            deq = np.empty(n, dtype=np.float32)
            lib.twobit_dequantize(words, n, t32, deq)
            assert np.array_equal(deq.view(np.uint32), mx_deq.view(np.uint32)), (n, t)


THRESHOLD_TEXTS = [
    "0.5", "1", "0.25", "1e-3", "1E-3", "5e+2", ".5", "5.", "+0.75", " 0.5", "\t0.5", "\n0.5",
    "0.5f", "0.5F", "Infinity", "inf", "INF", "-1", "0", "-0", "nan", "NaN", "nan(1)", "nan(",
    "abc", "", " ", "0.5 ", "0,5", "1e39", "4e38", "3e38", "3.4e38", "3.5e38", "1e-38", "1e-39",
    "1e-45", "1.2e-38", "0.1", "0.3", "0.7", "0.123456789", "1e-7", "1.5e-12", "2.5e-20",
    "0.0000000000000000000001", "0.00000000000000000012345", "12345678901234567890",
    "123456789012345678901234567890", "1e", "e5", ".", "+", "-", "f", "0x10", "1_000", "1e+",
    "infinit", "+infin", "7e-1f", "1.0e0",
]


def random_threshold_texts(rng, count):
    texts = []
    for _ in range(count):
        mant = f"{rng.uniform(0.1, 10):.{int(rng.integers(1, 12))}f}"
        form = int(rng.integers(0, 3))
        if form == 0:
            texts.append(mant)
        elif form == 1:
            texts.append(f"{mant}e-{int(rng.integers(0, 38))}")
        else:
            texts.append(f"{mant}e{int(rng.integers(0, 30))}")
    return texts


def error_kind(message):
    """The failure, named the same way for MXNet's messages and dshim's."""
    kinds = [("Required parameter type", "no 'type'", "missing type"),
             ("Unknown type", "unknown type", "bad type"),
             ("greater than 0", "greater than 0", "threshold <= 0"),
             ("Invalid Parameter format", "not a float", "not a float"),
             ("Check failed: *p == ')'", "not a float", "not a float"),  # dmlc: bad "nan("
             ("Out of range", "out of float's range", "out of range"),
             ("trailing characters", "trailing characters", "trailing characters")]
    for mx_text, dshim_text, kind in kinds:
        if mx_text in message or dshim_text in message:
            return kind
    return "other: " + message


def test_params_match_mxnet(core):
    """MXKVStoreSetGradientCompression and dshim_twobit_parse accept the same parameter sets,
    fail for the same reason, and agree on the threshold to the bit (dmlc's own float
    parser, which is not strtof: the count of texts where they differ is printed)."""
    kv = mx.kv.create("device")
    rng = np.random.default_rng(11)
    texts = THRESHOLD_TEXTS + random_threshold_texts(rng, 300)
    cases = [[("type", "2bit"), ("threshold", s)] for s in texts]
    cases += [
        [], [("type", "2bit")], [("threshold", "1")], [("type", "none")],
        [("type", "1bit"), ("threshold", "0.5")], [("type", "2BIT")],
        [("type", "2bit"), ("threshold", "1"), ("threshold", "0.25")],
        [("type", "2bit"), ("foo", "bar")], [("type", "none"), ("threshold", "-1")],
        [("threshold", "abc"), ("type", "none")], [("type", "none"), ("type", "2bit")],
    ]
    libc = ctypes.CDLL(None)
    libc.strtof.restype = ctypes.c_float
    libc.strtof.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    not_strtof = 0
    for key, params in enumerate(cases):
        mx_t, mx_err = mxnet_set_params(kv, key, params)
        t, err = dshim_parse(core, params)
        if mx_err and "Out of range" in mx_err and params[-1][1].strip().lower().startswith("inf"):
            continue   # MXNet's dmlc::stof tests a stale errno: "inf" fails at random
        assert (mx_err is None) == (err is None), f"{params}: mxnet {mx_err!r}, dshim {err!r}"
        if err is not None:
            assert error_kind(mx_err) == error_kind(err), f"{params}: {mx_err!r} vs {err!r}"
            continue
        assert f32_bits(t) == f32_bits(mx_t), f"{params}: dshim {t!r} mxnet {mx_t!r}"
        text = dict(params).get("threshold")
        if text is not None and f32_bits(libc.strtof(text.encode(), None)) != f32_bits(t):
            not_strtof += 1
    print(f"{len(cases)} parameter sets agree; strtof would differ on {not_strtof}")


def test_encode_decode_match_mxnet(mxgc, core):
    """EncodeParams text, and DecodeParams (what a server sets) from that text."""
    rng = np.random.default_rng(5)
    bits = rng.integers(1, 0x7F800000, 300, dtype=np.uint64).astype(np.uint32)
    thresholds = [0.5, 0.1, 1e-7, 0.123456789, 2e-6, 3.4028235e38, 1e-45, np.inf, 1.0, 100.25]
    thresholds += list(bits.view(np.float32)) + list(10.0 ** rng.uniform(-8, 8, 200))
    buf = ctypes.create_string_buffer(64)
    assert mxgc.encode(mxgc.new()) == "0"
    assert core.twobit_encode_params(0, 0.5, buf, 64) == 1 and buf.value == b"0"
    for t in thresholds:
        t32 = float(np.float32(t))
        text = mxgc.encode(mxgc.new(t32))
        assert core.twobit_encode_params(1, t32, buf, 64) == len(text)
        assert buf.value.decode() == text, t32
        server = mxgc.new()
        mxgc.decode(server, text)
        mx_type, mx_t = mxgc.fields(server)
        dt, de = ctypes.c_float(0.0), ctypes.c_int(-1)
        assert core.twobit_decode_params(text.encode(), ctypes.byref(dt), ctypes.byref(de)) == 0
        assert (de.value, f32_bits(dt.value)) == (mx_type, f32_bits(mx_t)), text
        assert f32_bits(core.twobit_server_threshold(t32)) == f32_bits(mx_t), text
    for text, previous in [("0", 0.75), ("1", 0.75), ("1,", 0.75), ("1,,0.3", 0.75), ("0,0.25", 0.75)]:
        server = mxgc.new(previous)
        mxgc.decode(server, text)
        dt, de = ctypes.c_float(previous), ctypes.c_int(-1)
        assert core.twobit_decode_params(text.encode(), ctypes.byref(dt), ctypes.byref(de)) == 0
        assert (de.value, dt.value) == mxgc.fields(server), text
