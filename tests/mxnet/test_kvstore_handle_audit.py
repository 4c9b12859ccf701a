"""Every C API function of libmxnet 1.9.1 that takes a KVStoreHandle is carried
by dshim: none may receive dshim's handle (MXNet would cast it to its own
KVStore and crash).

The list is the audit of apache/mxnet at tag 1.9.1:
    git grep -n KVStoreHandle 1.9.1 -- include/mxnet/c_api.h src/c_api
    git grep -n 'static_cast<KVStore\\*>' 1.9.1 -- src
gives the 27 exported MXKVStore* functions of src/c_api/c_api.cc that take (or,
for MXKVStoreCreate, return) one (MXKVStoreSetUpdaterImpl there is internal), and 4 of src/c_api/c_api_profile.cc, which cast it
when profile_process is 'server'.  Checked here: (1) under the preload, MXNet's
own way of finding them (dlsym on the ctypes handle of libmxnet) returns code
of libdshim.so for each, and code of libmxnet for the functions of the same
families that take none; (2) the installed libmxnet exports exactly these
families' names, so a libmxnet with a new one fails this test until it is
classified."""
import json
import shutil
import subprocess

import pytest

from mxjob import LIB, PY, ROOT, clean_env

pytestmark = pytest.mark.timeout(120)

LIBMXNET = ROOT / ".venv-mxnet" / "lib" / "python3.10" / "site-packages" / "mxnet" / "libmxnet.so"

if not PY.exists() or not LIB.exists() or not LIBMXNET.exists():
    pytest.skip("needs .venv-mxnet (make setup) and a build", allow_module_level=True)

TAKE_A_HANDLE = [
    # src/c_api/c_api.cc
    "MXKVStoreCreate", "MXKVStoreSetGradientCompression", "MXKVStoreFree", "MXKVStoreInit",
    "MXKVStoreInitEx", "MXKVStorePush", "MXKVStorePushEx", "MXKVStorePull", "MXKVStorePullEx",
    "MXKVStoreBroadcast", "MXKVStoreBroadcastEx", "MXKVStorePushPull", "MXKVStorePushPullEx",
    "MXKVStorePullWithSparse", "MXKVStorePullWithSparseEx", "MXKVStorePullRowSparse",
    "MXKVStorePullRowSparseEx", "MXKVStoreSetUpdater", "MXKVStoreSetUpdaterEx", "MXKVStoreGetRank",
    "MXKVStoreGetGroupSize", "MXKVStoreBarrier", "MXKVStoreSetBarrierBeforeExit", "MXKVStoreRunServer",
    "MXKVStoreSendCommmandToServers", "MXKVStoreGetType", "MXKVStoreGetNumDeadNode",
    # src/c_api/c_api_profile.cc (profile_process='server')
    "MXSetProcessProfilerConfig", "MXSetProcessProfilerState", "MXDumpProcessProfile",
    "MXProcessProfilePause",
]

# Exported names of the same families that take no KVStoreHandle: MXNet's own, always.
NO_HANDLE = [
    "MXKVStoreIsWorkerNode", "MXKVStoreIsServerNode", "MXKVStoreIsSchedulerNode",
    "MXSetProfilerConfig", "MXSetProfilerState", "MXDumpProfile", "MXProfilePause",
    "MXAggregateProfileStatsPrint", "MXAggregateProfileStatsPrintEx", "MXProfileCreateDomain",
    "MXProfileCreateTask", "MXProfileCreateFrame", "MXProfileCreateEvent", "MXProfileCreateCounter",
    "MXProfileDestroyHandle", "MXProfileDurationStart", "MXProfileDurationStop", "MXProfileSetCounter",
    "MXProfileAdjustCounter", "MXProfileSetMarker",
]

# Which object's code each name resolves to, found as MXNet's Python finds it.
PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1], ctypes.RTLD_LOCAL)
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
dladdr = ctypes.CDLL(None).dladdr
dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
where = {}
for name in sys.argv[2:]:
    info = DlInfo()
    addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    where[name] = info.fname.decode() if dladdr(addr, ctypes.byref(info)) else None
print(json.dumps(where))
"""


def _resolve(names):
    env = clean_env({"LD_PRELOAD": str(LIB)})
    p = subprocess.run([str(PY), "-c", PROBE, str(LIBMXNET)] + names, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=100)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test_every_function_taking_a_kvstore_handle_is_dshims():
    where = _resolve(TAKE_A_HANDLE + NO_HANDLE)
    not_ours = [n for n in TAKE_A_HANDLE if not where[n].endswith("/libdshim.so")]
    assert not_ours == [], {n: where[n] for n in not_ours}
    taken = [n for n in NO_HANDLE if not where[n].endswith("/libmxnet.so")]
    assert taken == [], {n: where[n] for n in taken}


def test_without_takeover_everything_stays_mxnets():
    """DSHIM_MXNET=0 (ps-lite under the preload): no name is taken."""
    names = TAKE_A_HANDLE[:3] + TAKE_A_HANDLE[-4:]
    p = subprocess.run([str(PY), "-c", PROBE, str(LIBMXNET)] + names,
                       env=clean_env({"LD_PRELOAD": str(LIB), "DSHIM_MXNET": "0"}),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=100)
    assert p.returncode == 0, p.stderr[-3000:]
    where = json.loads(p.stdout)
    assert all(w.endswith("/libmxnet.so") for w in where.values()), where


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils) to list libmxnet's exports")
def test_the_list_matches_libmxnets_exports():
    out = subprocess.run(["nm", "-D", "--defined-only", str(LIBMXNET)], stdout=subprocess.PIPE, text=True,
                         check=True, timeout=100).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()}
    c_api = {n for n in exported if n.startswith("MX") and n.isidentifier() and ("KVStore" in n or "Profil" in n)}
    assert sorted(set(TAKE_A_HANDLE) - exported) == [], "audited names libmxnet does not export"
    unclassified = sorted(c_api - set(TAKE_A_HANDLE) - set(NO_HANDLE))
    assert unclassified == [], "libmxnet exports these: read their source and classify them"
    assert len(TAKE_A_HANDLE) == len(set(TAKE_A_HANDLE)) == 31
