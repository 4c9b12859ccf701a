"""A user's script that profiles the servers of a dist_sync kvstore (MXNet's
profile_process='server'), as MXNet 1.9.1 documents it: every worker calls the
profiler API; worker 0's calls reach the servers, which configure, start, pause,
stop and dump MXNet's profiler in their own process into
rank<server rank>_<filename> in their working directory.

Worker 0 checks, right after dump(profile_process='server') returned, that
every server's file is complete JSON, and writes the events it found to
OUT/profiling_rank0.json.  Every worker also profiles itself
(profile_process='worker', the same kvstore handle passed to MXNet).  With
--errors, worker 0 then asks what the servers must refuse and records each
MXNetError: a config parameter MXNet does not know, a value with a ',' (MXNet's
wire has no escaping) and a second dump of a finished profile.
Usage: python server_profiling.py OUT [--errors]
"""
import argparse
import glob
import json
import os

import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--errors", action="store_true")
args = p.parse_args()

kv = mx.kv.create("dist_sync")
suffix = "server_profile.json"
mx.profiler.set_config(filename=suffix, profile_all=True, profile_process="server")
mx.profiler.set_state(state="run", profile_process="server")
# the worker's own profiler, given the same (dshim's) kvstore handle, stays MXNet's
worker_file = "rank%d_worker_profile.json" % kv.rank
mx.profiler.set_config(filename=worker_file, profile_all=True, profile_process="worker")
mx.profiler.set_state(state="run", profile_process="worker")

shape = (300, 300)
kv.init("w", mx.nd.ones(shape))
kv.set_optimizer(mx.optimizer.create("sgd", learning_rate=0.1))
val = mx.nd.zeros(shape)
for step in range(6):
    if step == 3:
        # the servers' profiler paused for a round, then resumed
        mx.profiler.pause(profile_process="server")
    kv.push("w", mx.nd.ones(shape) * (kv.rank + 1))
    kv.pull("w", out=val)
    val.wait_to_read()
    if step == 3:
        mx.profiler.resume(profile_process="server")
mx.profiler.set_state(state="stop", profile_process="server")
mx.profiler.dump(finished=True, profile_process="server")
mx.profiler.set_state(state="stop", profile_process="worker")
mx.profiler.dump(finished=True, profile_process="worker")
with open(worker_file) as f:
    worker_events = sorted({e.get("name", "") for e in json.load(f)["traceEvents"]})

result = {"rank": kv.rank, "num_servers": int(os.environ["DMLC_NUM_SERVER"]),
          "files": sorted(glob.glob("rank*_" + suffix)), "events": {}, "errors": {},
          "worker_events": worker_events}
if kv.rank == 0:
    for s in range(result["num_servers"]):
        name = "rank%d_%s" % (s, suffix)
        with open(name) as f:
            events = json.load(f)["traceEvents"]  # complete JSON, or this raises
        result["events"][name] = sorted({e.get("name", "") for e in events})
    if args.errors:
        attempts = {
            "unknown_parameter": lambda: mx.profiler.set_config(filename=suffix, profile_bogus=True,
                                                                profile_process="server"),
            "comma_in_value": lambda: mx.profiler.set_config(filename="a,b.json", profile_process="server"),
            "dump_after_finished": lambda: mx.profiler.dump(finished=True, profile_process="server"),
        }
        for what, call in attempts.items():
            try:
                call()
                result["errors"][what] = None
            except mx.base.MXNetError as e:
                result["errors"][what] = str(e).splitlines()[0]
    with open(os.path.join(args.out, "profiling_rank0.json"), "w") as f:
        json.dump(result, f, indent=1)
kv._barrier()  # every worker stays until worker 0 has checked the servers
print("worker %d: done" % kv.rank, flush=True)
