"""Worker 1 parks (the test kills it); worker 0's next kvstore call fails, and it asks
MXKVStoreGetNumDeadNode (C API only in MXNet 1.9.1) how many workers died."""
import ctypes
import os
import sys
import time

import mxnet as mx

out = sys.argv[1]
kv = mx.kv.create("dist_sync")
a = mx.nd.ones((4,))
kv.init(0, a)
with open(os.path.join(out, "pid_worker%d" % kv.rank), "w") as f:
    f.write(str(os.getpid()))
if kv.rank == 1:
    while True:
        time.sleep(1)
try:
    # a pushpull runs inside MXNet's engine: its failure shows at the first read of its output
    # (MXNet prefixes an engine operation's error with "MXNetError: ")
    kv.pushpull(0, a)
    a.wait_to_read()
    kv._barrier()
    print("kvstore calls returned", flush=True)
except mx.base.MXNetError as e:
    print("kvstore call failed:", str(e).splitlines()[0], flush=True)
n = ctypes.c_int(-1)
mx.base.check_call(mx.base._LIB.MXKVStoreGetNumDeadNode(kv.handle, 4, ctypes.byref(n), 60))
print("dead workers: %d" % n.value, flush=True)
s = ctypes.c_int(-1)
mx.base.check_call(mx.base._LIB.MXKVStoreGetNumDeadNode(kv.handle, 2, ctypes.byref(s), 60))
print("dead servers: %d" % s.value, flush=True)
os._exit(3)
