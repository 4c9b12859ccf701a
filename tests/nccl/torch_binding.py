"""The real torch wheel's NCCL calls resolve to libdshim.so under LD_PRELOAD (no GPU needed).

    torch_binding.py LIBDSHIM

torch.cuda.nccl.unique_id() calls ncclGetUniqueId in libtorch_cuda.so: preloaded, the id is dshim's
(it starts with b"DSHN"); in a process without the preload it is real NCCL's.  Also lists which
NCCL functions libtorch_cuda.so imports and checks that libdshim.so exports every one.
Exit 77 (skipped) without torch's NCCL.
"""
import os
import subprocess
import sys

lib = os.path.abspath(sys.argv[1])
try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("torch_binding: no torch: skipped")
    sys.exit(77)
if not dist.is_nccl_available():
    print("torch_binding: this torch has no NCCL: skipped")
    sys.exit(77)

probe = "import torch.cuda.nccl as n; print(n.unique_id()[:4])"
env = dict(os.environ, DSHIM_TAKEOVER="0")
pre = subprocess.run([sys.executable, "-c", probe], env=dict(env, LD_PRELOAD=lib), capture_output=True,
                     text=True, timeout=120)
plain = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
fails = []
if pre.returncode != 0 or "b'DSHN'" not in pre.stdout:
    fails.append(f"preloaded: the id is not dshim's: {pre.stdout.strip()} {pre.stderr.strip()[-400:]}")
if plain.returncode == 0 and "b'DSHN'" in plain.stdout:
    fails.append("without the preload the id is dshim's too: the test proves nothing")

cuda_lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
nm = lambda *a: subprocess.run(["nm", "-D", *a], capture_output=True, text=True, check=True).stdout.split("\n")
imported = sorted({l.split()[-1].split("@")[0] for l in nm(cuda_lib) if " U nccl" in l or " U pnccl" in l})
exported = {l.split()[-1] for l in nm("--defined-only", lib) if l.strip()}
missing = [f for f in imported if f not in exported]
if missing:
    fails.append(f"libtorch_cuda.so imports NCCL functions libdshim.so lacks: {missing}")
print(f"torch {torch.__version__} (NCCL {'.'.join(map(str, torch.cuda.nccl.version()))} at build): "
      f"imports {len(imported)} NCCL functions, all exported by libdshim.so: {'no' if missing else 'yes'}; "
      f"preloaded unique id: {pre.stdout.strip()}, without: {plain.stdout.strip() or plain.stderr.strip()[-80:]}")
for f in fails:
    print("FAIL:", f)
print(f"{0 if fails else 1} passed, {1 if fails else 0} failed")
sys.exit(1 if fails else 0)
