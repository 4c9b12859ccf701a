#!/usr/bin/env python3
"""Interleaved allreduce benchmark: dshim (shm, tcp) vs gloo vs OpenMPI (shm, tcp), and the TCP wire.

    python3 bench/run_bench.py --build build --venv .venv --np 2,4 \\
        --sizes 4K,64K,1M,16M,64M --reps 3 --out docs/benchmarks.md [--quick]

For every repetition and every process count the six runs go one after the
other (dshim shm, dshim tcp, gloo, OpenMPI shm, OpenMPI tcp, then the TCP wire:
bench/tcp_wire.c, the kernel's loopback TCP moving the same bytes with no
library, the bound of the TCP columns), so slow drifts of the shared machine
hit all of them alike.  Before each run the
harness waits (bounded) until the machine is quiet and afterwards records the
CPU that other processes used during the run.  Raw results are appended to
BUILD/bench/results.jsonl, one record per run to BUILD/bench/runs.jsonl, each
run's console output to BUILD/bench/logs/RUN_ID/; the summary (median over
repetitions, targets with PASS/FAIL) is written to --out.

Only the standard library is used here, so any python3 can run the harness;
the gloo part runs under VENV/bin/python.  Exit status: 0 when the report was
written (even if targets fail or an implementation is missing), 1 when the
harness itself broke, 2 on bad arguments, 130 on Ctrl-C.
"""
import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (impl, transport) in the order they run inside one repetition.
ORDER = [("dshim", "shm"), ("dshim", "tcp"), ("gloo", "tcp"),
         ("openmpi", "shm"), ("openmpi", "tcp"), ("wire", "tcp")]
IMPL_KEYS = {f"{i}-{t}": (i, t) for i, t in ORDER}
IMPL_KEYS["gloo"] = ("gloo", "tcp")
LABEL = {("dshim", "shm"): "dshim shm", ("dshim", "tcp"): "dshim tcp",
         ("gloo", "tcp"): "gloo (tcp)", ("openmpi", "shm"): "OpenMPI shm",
         ("openmpi", "tcp"): "OpenMPI tcp", ("wire", "tcp"): "TCP wire (bound)"}
MPI_BTL = {"shm": ["--mca", "pml", "ob1", "--mca", "btl", "vader,self"],
           "tcp": ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                   "--mca", "btl_tcp_if_include", "lo"]}
# Rendezvous variables a caller's shell may carry (e.g. when run under
# torchrun or mpirun); each benchmark sets up its own job, so drop them.
STRIP_ENV_PREFIXES = ("OMPI_COMM_WORLD_", "PMI_", "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS")
STRIP_ENV = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "DSHIM_RANK", "DSHIM_WORLD_SIZE", "DSHIM_STORE_ADDR", "DSHIM_STORE_PORT",
             "DSHIM_STORE_EXTERNAL", "DSHIM_JOB_TOKEN", "DSHIM_TRANSPORT"}
REQUIRED_KEYS = ("impl", "np", "bytes", "time_us")
QUICK = dict(reps=1, sizes="4K,1M", np="2")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MIB = 1 << 20


class HarnessError(Exception):
    """The harness itself cannot go on (not: an implementation failed)."""


# ---------------------------------------------------------------- helpers

def parse_size(text):
    t = text.strip().upper()
    if t.endswith("B"):
        t = t[:-1]
    mult = UNITS.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    value = int(t) * mult
    if value < 4 or value % 4:
        raise ValueError(f"size {text!r}: need a positive multiple of 4 bytes (float32)")
    return value


def fmt_size(b):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m} {unit}"
    return f"{b} B"


def fmt_time(us):
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


def fmt_bw(gbps):
    return f"{gbps:.3f}" if gbps < 10 else f"{gbps:.2f}"


def rel(path):
    """Path relative to the repository when inside it, else absolute."""
    r = os.path.relpath(path, REPO)
    return os.path.abspath(path) if r.startswith("..") else r


def size_arg(b):
    """4096 -> '4K': the suffixed form dshim-bench's contract shows."""
    for suffix, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b % m == 0:
            return f"{b // m}{suffix}"
    return str(b)


def busfac(n):
    return 2.0 * (n - 1) / n if n > 1 else 1.0


def geometric_factor(sizes):
    """(f, exact): the largest integer f >= 2 with every size = min * f**k.

    dshim-bench takes a geometric sweep (-b/-e/-f); one call per sweep keeps
    its start-up cost out of the comparison.  When the requested sizes skip
    steps (4K,64K,1M,16M,64M needs f=4) the extra sizes it measures are kept
    in the raw file but left out of the tables; exact says none are extra.
    (None, False) when no integer factor covers the sizes.
    """
    s = sorted(set(sizes))
    if len(s) == 1:
        return 2, True
    lo = s[0]
    if any(x % lo for x in s):
        return None, False
    ratios = [x // lo for x in s[1:]]

    def exponent(x, f):
        """k with f**k == x, else None."""
        k = 0
        while x % f == 0:
            x //= f
            k += 1
        return k if x == 1 else None

    # f**k == ratios[0] for some k >= 1; the smallest k gives the largest f
    for k in range(1, ratios[0].bit_length() + 1):
        f = round(ratios[0] ** (1.0 / k))
        for cand in (f - 1, f, f + 1):
            if cand >= 2 and cand ** k == ratios[0] and \
                    all(exponent(r, cand) is not None for r in ratios):
                return cand, exponent(ratios[-1], cand) == len(ratios)
    return None, False


# ------------------------------------------------------ machine quietness

def cpu_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v), v[3] + v[4]  # total, idle+iowait


def wait_quiet(busy_max, quiet_s, max_wait_s, step_s=0.5):
    """Wait until total CPU busy < busy_max for quiet_s seconds in a row.

    The harness sleeps meanwhile and its previous run has been reaped, so the
    busy share seen here is other processes' load.  Bounded: after max_wait_s
    the run goes ahead and the record says it was not quiet.
    """
    t0 = time.monotonic()
    run = 0.0
    samples = []
    prev = cpu_jiffies()
    while True:
        time.sleep(step_s)
        cur = cpu_jiffies()
        dt = max(1, cur[0] - prev[0])
        busy = 1.0 - (cur[1] - prev[1]) / dt
        prev = cur
        samples.append(busy)
        run = run + step_s if busy < busy_max else 0.0
        waited = time.monotonic() - t0
        if run >= quiet_s - 1e-9:
            return dict(quiet=True, waited_s=round(waited, 1),
                        busy_before_pct=round(100 * max(samples[-int(quiet_s / step_s):]), 1))
        if waited >= max_wait_s:
            return dict(quiet=False, waited_s=round(waited, 1),
                        busy_before_pct=round(100 * statistics.median(samples[-4:]), 1))


def descendants(pid):
    """PIDs below pid (children of our children), read from /proc."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            ppid = int(st[st.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc):
    """Stop a run we started: TERM, then KILL, each process by its PID."""
    victims = [proc.pid] + descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        victims = [p for p in victims if os.path.exists(f"/proc/{p}")]
        if not victims:
            break
    if proc.returncode is None:
        proc.wait()



def run_json_job(cmd, env, log_path, json_path, timeout, max_wait, what):
    """Runs one job of a Python benchmark (ddp_bench, horovod_bench) once the machine is quiet: its
    output to log_path, its result read from the JSON file its rank 0 writes.  Exits naming `what` and
    the log's tail when it fails.  Returns (result dict, wall seconds, whether it started quiet)."""
    quiet = wait_quiet(0.15, 2.0, max_wait)
    print(f"+ {what}: {shlex.join(cmd)}", flush=True)
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p)
            rc = "timeout"
        except BaseException:
            kill_tree(p)
            raise
    wall = time.monotonic() - t0
    if rc != 0 or not os.path.exists(json_path):
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"{what} failed (rc {rc}); log {log_path}:\n{tail}")
    with open(json_path) as f:
        return json.load(f), wall, quiet["quiet"]

def build_bench_c(name, compiler, out_dir, log_dir):
    """Compiles bench/NAME.c into OUT_DIR/NAME when missing or older than its
    source or bench/bench_size.h; None when usable, else why not (the
    compiler's output in LOG_DIR/NAME-build.log)."""
    src = os.path.join(REPO, "bench", name + ".c")
    exe = os.path.join(out_dir, name)
    newest = max(os.path.getmtime(src), os.path.getmtime(os.path.join(REPO, "bench", "bench_size.h")))
    if os.path.exists(exe) and os.path.getmtime(exe) >= newest:
        return None
    os.makedirs(out_dir, exist_ok=True)
    cmd = [compiler, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE",
           "-o", exe, src, "-lm"]
    print("+ " + shlex.join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, name + "-build.log"), "w") as f:
            f.write(out.stdout + out.stderr)
        return f"{os.path.basename(compiler)} failed on bench/{name}.c (see {log_dir}/{name}-build.log)"
    return None


# ------------------------------------------------------------ the harness

class Bench:
    def __init__(self, args):
        self.a = args
        self.build = os.path.abspath(args.build)
        self.venv = os.path.abspath(args.venv)
        self.bench_dir = os.path.join(self.build, "bench")
        self.results_path = args.results or os.path.join(self.bench_dir, "results.jsonl")
        self.runs_path = os.path.join(self.bench_dir, "runs.jsonl")
        self.run_id = args.run_id or (datetime.datetime.now(datetime.timezone.utc)
                                      .strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}")
        self.log_dir = os.path.join(self.bench_dir, "logs", self.run_id)
        self.avail = {}      # (impl, transport) -> None if usable, else reason
        self.versions = {}
        self.current = None  # Popen of the run in progress
        # how this report came about, stored with every run for --report-only
        self.command_line = (f"cd {shlex.quote(os.getcwd())} && "
                             f"{os.path.basename(sys.executable)} {shlex.join(sys.argv)}")
        self.started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        self.sizes = args.size_list
        self.nps = args.np_list

    # -- availability -----------------------------------------------------

    def probe(self):
        os.makedirs(self.log_dir, exist_ok=True)
        wanted = set(self.a.impl_list)
        if wanted & {("dshim", "shm"), ("dshim", "tcp")}:
            exe = os.path.join(self.build, "bin", "dshim-bench")
            why = None
            if not os.access(exe, os.X_OK):
                why = f"{rel(exe)} not built (cmake --build {self.a.build} --target dshim-bench)"
            self.avail[("dshim", "shm")] = self.avail[("dshim", "tcp")] = why
            if why is None and geometric_factor(self.sizes)[0] is None:
                self.avail[("dshim", "shm")] = self.avail[("dshim", "tcp")] = \
                    "sizes are not a geometric series, which dshim-bench -b/-e/-f needs"
        if ("gloo", "tcp") in wanted:
            self.avail[("gloo", "tcp")] = self.probe_gloo()
        if wanted & {("openmpi", "shm"), ("openmpi", "tcp")}:
            mpicc = shutil.which("mpicc")
            why = "mpicc/mpirun not on PATH (apt-get install libopenmpi-dev openmpi-bin)" \
                if not mpicc or not shutil.which("mpirun") else \
                build_bench_c("mpi_bench", mpicc, self.bench_dir, self.log_dir)
            self.avail[("openmpi", "shm")] = self.avail[("openmpi", "tcp")] = why
        if ("wire", "tcp") in wanted:
            cc = shutil.which("cc") or shutil.which("gcc")
            self.avail[("wire", "tcp")] = "no C compiler (cc) on PATH" if not cc else \
                build_bench_c("tcp_wire", cc, self.bench_dir, self.log_dir)
        for key in ORDER:
            if key not in wanted:
                self.avail[key] = "not selected (--impls)"
        self.versions.update(self.tool_versions())

    def probe_gloo(self):
        py = os.path.join(self.venv, "bin", "python")
        if not os.access(py, os.X_OK):
            return f"{py} not found (create the venv with torch, or pass --venv)"
        code = ("import torch, torch.distributed as d; "
                "print(torch.__version__, d.is_available() and d.is_gloo_available())")
        try:
            out = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            return f"{py} -c 'import torch' took over 180 s"
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["?"])[-1]
            return f"torch does not import in {py}: {last}"
        ver, ok = out.stdout.split()[:2]
        self.versions["torch"] = ver
        return None if ok == "True" else f"torch {ver} in {py} has no gloo backend"

    def tool_versions(self):
        v = {}

        def first_line(cmd):
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                return (out.stdout.strip().splitlines() or [""])[0]
            except (OSError, subprocess.TimeoutExpired):
                return ""
        if shutil.which("mpirun"):
            v["openmpi"] = first_line(["mpirun", "--version"])
        v["gcc"] = first_line(["gcc", "--version"])
        commit = first_line(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
        v["dshim commit"] = commit or "unknown"
        return v

    # -- one run ---------------------------------------------------------

    def command(self, impl, transport, n, json_path):
        env = {k: v for k, v in os.environ.items()
               if k not in STRIP_ENV and not k.startswith(STRIP_ENV_PREFIXES)}
        env["OMP_NUM_THREADS"] = "1"
        sizes_csv = ",".join(str(s) for s in self.sizes)
        mt = [] if self.a.min_time is None else ["-t", str(self.a.min_time)]
        if impl == "dshim":
            f, _ = geometric_factor(self.sizes)
            env["DSHIM_TRANSPORT"] = transport
            if transport == "tcp":
                env["DSHIM_SOCKET_IFNAME"] = "lo"
            cmd = [os.path.join(self.build, "bin", "dshim-bench"), "-n", str(n), "-o", "allreduce",
                   "-d", "float32", "-r", "sum", "-b", size_arg(min(self.sizes)),
                   "-e", size_arg(max(self.sizes)), "-f", str(f), "--in-place", "-j", json_path] + mt
        elif impl == "wire":
            cmd = [os.path.join(self.bench_dir, "tcp_wire"), "-n", str(n), "-s", sizes_csv,
                   "-j", json_path] + mt
        elif impl == "gloo":
            cmd = [os.path.join(self.venv, "bin", "python"),
                   os.path.join(REPO, "bench", "gloo_bench.py"), "--np", str(n),
                   "--sizes", sizes_csv, "-j", json_path,
                   "--timeout", str(max(10, self.a.timeout - 10))] + mt
        else:
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)] \
                + MPI_BTL[transport] \
                + [os.path.join(self.bench_dir, "mpi_bench"), "-T", transport,
                   "-s", sizes_csv, "-j", json_path] + mt
        return cmd, env

    def run_one(self, rep, n, impl, transport):
        rec = dict(kind="run", run_id=self.run_id, rep=rep, np=n, impl=impl, transport=transport,
                   command=self.command_line, started=self.started)
        why = self.avail.get((impl, transport))
        if why is not None:
            rec.update(status="missing", reason=why)
            return rec, []
        name = f"rep{rep}-np{n}-{impl}-{transport}"
        json_path = os.path.join(self.log_dir, name + ".jsonl")
        log_path = os.path.join(self.log_dir, name + ".log")
        if os.path.exists(json_path):
            os.unlink(json_path)
        cmd, env = self.command(impl, transport, n, json_path)
        rec["cmd"] = shlex.join(cmd)
        rec.update(wait_quiet(self.a.busy_max, self.a.quiet_secs, self.a.max_wait))

        print(f"[rep {rep} np {n}] {LABEL[(impl, transport)]:<12} "
              f"(waited {rec['waited_s']:.0f}s, {'quiet' if rec['quiet'] else 'NOT quiet'}) ...",
              end="", flush=True)
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        j0 = cpu_jiffies()
        w0 = time.monotonic()
        status = "ok"
        with open(log_path, "w") as log:
            log.write("+ " + rec["cmd"] + "\n")
            log.flush()
            self.current = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                rc = self.current.wait(timeout=self.a.timeout)
            except subprocess.TimeoutExpired:
                kill_tree(self.current)
                rc = self.current.returncode
                status = "timeout"
            except KeyboardInterrupt:
                kill_tree(self.current)
                raise
            finally:
                self.current = None
        wall = time.monotonic() - w0
        j1 = cpu_jiffies()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        hz = os.sysconf("SC_CLK_TCK")
        sys_busy_s = ((j1[0] - j0[0]) - (j1[1] - j0[1])) / hz
        # Children's CPU counts every descendant that was reaped (mpirun's
        # ranks, our launchers' ranks); the rest of the busy time is foreign.
        own_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        foreign = max(0.0, sys_busy_s - own_s) / (max(wall, 1e-3) * (os.cpu_count() or 1)) * 100
        if status == "ok" and rc != 0:
            status = "failed"
        rec.update(rc=rc, wall_s=round(wall, 2), own_cpu_s=round(own_s, 2),
                   foreign_cpu_pct=round(foreign, 1), log=rel(log_path))

        rows, bad = self.read_rows(json_path, rec)
        got = {r["bytes"] for r in rows if r["in_sweep"]}
        lost = [s for s in self.sizes if s not in got]
        if status == "ok" and lost:
            status = "partial"
        if bad:
            rec["bad_lines"] = bad
        if lost:
            rec["sizes_missing"] = lost
        rec["status"] = status
        mism = sorted({r["reported_transport"] for r in rows
                       if r.get("reported_transport") not in (None, transport)})
        if mism:
            rec["transport_mismatch"] = mism
        print(f" {status} in {wall:.1f}s, foreign CPU {foreign:.1f}%"
              + (f", transport reported {mism}" if mism else "")
              + (f" (see {rec['log']})" if status != "ok" else ""), flush=True)
        return rec, rows

    def read_rows(self, json_path, rec):
        rows, bad = [], 0
        if not os.path.exists(json_path):
            return rows, bad
        with open(json_path) as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    if not all(k in r for k in REQUIRED_KEYS) or float(r["time_us"]) <= 0:
                        raise ValueError("missing keys")
                    r["bytes"] = int(r["bytes"])
                    r["np"] = int(r["np"])
                except (ValueError, TypeError):
                    bad += 1
                    continue
                # a size whose correctness check failed measures nothing
                if r["np"] != rec["np"] or str(r.get("check", "ok")).upper() == "FAIL":
                    bad += 1
                    continue
                # the summary keys on the transport we asked for; keep what the
                # implementation said it used so a silent fallback is visible
                r["reported_transport"] = r.get("transport")
                r.update(impl=rec["impl"], transport=rec["transport"], run_id=self.run_id,
                         rep=rec["rep"], in_sweep=r["bytes"] in self.sizes,
                         quiet=rec["quiet"], foreign_cpu_pct=rec["foreign_cpu_pct"])
                rows.append(r)
        return rows, bad

    def run_all(self):
        runs, rows = [], []
        os.makedirs(self.bench_dir, exist_ok=True)
        # what --report-only needs to rebuild the report later, as of now
        meta = dict(kind="meta", run_id=self.run_id, command=self.command_line,
                    started=self.started, versions=self.versions, sizes=self.sizes, nps=self.nps,
                    reps=self.a.reps, avail={f"{i}-{t}": why for (i, t), why in self.avail.items()})
        with open(self.runs_path, "a") as f:
            f.write(json.dumps(meta) + "\n")
        for rep in range(1, self.a.reps + 1):
            for n in self.nps:
                for impl, transport in ORDER:
                    if (impl, transport) not in self.a.impl_list:
                        continue
                    rec, got = self.run_one(rep, n, impl, transport)
                    runs.append(rec)
                    rows.extend(got)
                    with open(self.runs_path, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                    if got:
                        with open(self.results_path, "a") as f:
                            for r in got:
                                f.write(json.dumps(r) + "\n")
        return runs, rows


# ------------------------------------------------------------- the report

class Summary:
    def __init__(self, runs, rows, sizes, nps):
        self.runs, self.sizes, self.nps = runs, sizes, nps
        self.groups = {}
        for r in rows:
            if r.get("in_sweep", True):
                key = (r["impl"], r["transport"], r["np"], r["bytes"])
                self.groups.setdefault(key, []).append(r)
        self.status = {}
        for rec in runs:
            self.status.setdefault((rec["impl"], rec["transport"], rec["np"]), []).append(rec)

    def value(self, impl, transport, n, size):
        """(median time_us over reps, busbw from it, per-rep busbw list) or None."""
        rs = self.groups.get((impl, transport, n, size))
        if not rs:
            return None
        t = statistics.median(float(r["time_us"]) for r in rs)
        bws = [size / float(r["time_us"]) / 1e3 * busfac(n) for r in rs]
        return t, size / t / 1e3 * busfac(n), bws

    def why_empty(self, impl, transport, n):
        recs = self.status.get((impl, transport, n), [])
        if not recs:
            return "not run"
        if all(r["status"] == "missing" for r in recs):
            return "missing"
        return "failed" if any(r["status"] in ("failed", "timeout") for r in recs) else "no data"

    def cell(self, impl, transport, n, size):
        v = self.value(impl, transport, n, size)
        if v is None:
            return self.why_empty(impl, transport, n)
        t, bw, bws = v
        spread = f" [{min(bws):.2f}..{max(bws):.2f}]" if len(bws) > 1 else ""
        # a silent fallback (tcp asked, shm used) would make the row a lie
        used = sorted({str(r.get("reported_transport")) for r in self.groups[(impl, transport, n, size)]
                       if r.get("reported_transport") not in (None, transport)})
        warn = f" ⚠ reported {'/'.join(used)}" if used else ""
        return f"**{fmt_bw(bw)}** / {fmt_time(t)}{spread} ×{len(bws)}{warn}"

    def tables(self):
        out = []
        for n in self.nps:
            over = " (more ranks than cores: oversubscribed)" if n > (os.cpu_count() or 1) else ""
            out.append(f"### Allreduce float32 sum, N={n}{over}\n")
            out.append(f"cell: **busbw GB/s** / median time [busbw min..max over reps] ×reps; "
                       f"busbw = algbw × {busfac(n):.3g}\n")
            out.append("| size | " + " | ".join(LABEL[k] for k in ORDER) + " |")
            out.append("|---:|" + "---|" * len(ORDER))
            for s in self.sizes:
                out.append(f"| {fmt_size(s)} | "
                           + " | ".join(self.cell(i, t, n, s) for i, t in ORDER) + " |")
            out.append("")
        return out

    # -- targets ---------------------------------------------------------

    def target_rows(self):
        """(target, N, size, dshim, reference, ratio, wire's ratio, need, verdict) rows.

        The wire's ratio, on dshim tcp's rows: what the same target would read
        if dshim cost nothing at all, the kernel's loopback TCP moving the
        allreduce's bytes alone (bench/tcp_wire.c) in dshim's place."""
        rows = []

        def measured(n, size):
            return n in self.nps and size in self.sizes

        def row(name, n, size, a, b, use_time, need_text, ok):
            if not measured(n, size):
                return (name, n, fmt_size(size), "", "", "", "", need_text, "not measured")
            va, vb = self.value(*a, n, size), self.value(*b, n, size)

            def show(v):
                if v is None:
                    return ""
                return fmt_time(v[0]) if use_time else f"{fmt_bw(v[1])} GB/s"
            if va is None or vb is None:
                lack = " and ".join(LABEL[k] + " " + self.why_empty(*k, n)
                                    for k, v in ((a, va), (b, vb)) if v is None)
                return (name, n, fmt_size(size), show(va), show(vb), "", "", need_text, lack)

            def ratio_of(x):
                r = x[0] / vb[0] if use_time else x[1] / vb[1]
                return r, f"{r:.3f}" if r < 0.1 else f"{r:.2f}"
            ratio, shown = ratio_of(va)
            wire = ""
            if a == ("dshim", "tcp"):
                vw = self.value("wire", "tcp", n, size)
                wire = ratio_of(vw)[1] if vw else "n/a"
            return (name, n, fmt_size(size), show(va), show(vb), shown, wire, need_text,
                    "PASS" if ok(ratio) else "FAIL")

        def bw_row(name, n, size, a, b, factor):
            return row(name, n, size, a, b, False, f"≥ {factor:g}", lambda r: r >= factor)

        def time_row(name, n, size, a, b, need_text, ok):
            return row(name, n, size, a, b, True, need_text, ok)

        shm, tcp, gloo = ("dshim", "shm"), ("dshim", "tcp"), ("gloo", "tcp")
        oshm, otcp = ("openmpi", "shm"), ("openmpi", "tcp")
        for s in (1 * MIB, 16 * MIB, 64 * MIB):
            rows.append(bw_row("shm busbw ≥ 4× gloo", 2, s, shm, gloo, 4.0))
        for s in self.sizes:
            if s >= 64 << 10:
                rows.append(bw_row("shm busbw ≥ OpenMPI shm", 2, s, shm, oshm, 1.0))
        rows.append(time_row("4 KiB shm time ≤ gloo / 20 (ratio dshim/gloo)", 2, 4096, shm, gloo,
                             "≤ 0.05", lambda r: r <= 0.05))
        rows.append(time_row("4 KiB shm time ≤ 2× OpenMPI shm (ratio dshim/OpenMPI)", 2, 4096,
                             shm, oshm, "≤ 2", lambda r: r <= 2.0))
        for s in self.sizes:
            if s >= MIB:
                rows.append(bw_row("tcp busbw ≥ OpenMPI tcp", 2, s, tcp, otcp, 1.0))
                rows.append(bw_row("tcp busbw ≥ 1.5× gloo", 2, s, tcp, gloo, 1.5))
        for s in self.sizes:
            rows.append(bw_row("N=4 shm busbw ≥ gloo", 4, s, shm, gloo, 1.0))
            rows.append(bw_row("N=4 tcp busbw ≥ gloo", 4, s, tcp, gloo, 1.0))
        # more ranks than cores (the usual CPU job), every size
        for s in self.sizes:
            rows.append(bw_row("N=4 shm busbw ≥ OpenMPI shm", 4, s, shm, oshm, 1.0))
            rows.append(bw_row("N=4 tcp busbw ≥ OpenMPI tcp", 4, s, tcp, otcp, 1.0))
        return rows

    def targets(self):
        rows = self.target_rows()
        count = {}
        for r in rows:
            k = r[-1] if r[-1] in ("PASS", "FAIL", "not measured") else "missing or failed"
            count[k] = count.get(k, 0) + 1
        out = ["## Targets\n",
               "Ratios use the medians over repetitions; `ratio` is dshim ÷ reference "
               "(busbw rows: higher is better; time rows: lower is better). "
               "A target whose inputs were not produced says which implementation is missing "
               "or failed; `not measured` means the size or N was not in this sweep. "
               "`wire alone` (dshim tcp rows): the ratio the kernel's loopback TCP alone gets "
               "against the same reference, moving the allreduce's bytes with no library "
               "(the TCP wire column). Where the bytes dominate (1 MiB and up here) no "
               "implementation's ratio can be above it by more than the noise, short of moving "
               "fewer bytes than the ring; below that, with more ranks than cores, scheduling "
               "decides and the wire (a plain ring of processes) is no bound.\n",
               "**Result: " + ", ".join(f"{count.get(k, 0)} {k}"
                                       for k in ("PASS", "FAIL", "missing or failed", "not measured"))
               + "**\n",
               "| target | N | size | dshim | reference | ratio | wire alone | need | result |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            verdict = r[-1]
            if verdict in ("PASS", "FAIL"):
                verdict = f"**{verdict}**"
            out.append("| " + " | ".join(str(x) for x in r[:-1]) + f" | {verdict} |")
        out.append("")
        return out, count

    def run_log(self):
        out = ["## Runs\n",
               "Every run in the order it ran. `waited` = seconds spent waiting for a quiet "
               "machine before it; `foreign CPU` = CPU used by processes other than the run "
               "(system busy time minus the run's own reaped CPU) as % of all cores during the "
               "run: a few % is noise (loopback soft-IRQ work can land there), tens of % "
               "mean another workload overlapped.\n",
               "| rep | N | impl | status | wall s | waited s | quiet | foreign CPU % | note |",
               "|---:|---:|---|---|---:|---:|---|---:|---|"]
        for r in self.runs:
            label = LABEL[(r["impl"], r["transport"])]
            if r["status"] == "missing":
                out.append(f"| {r['rep']} | {r['np']} | {label} | missing | | | | | {r['reason']} |")
                continue
            note = []
            if r.get("sizes_missing"):
                note.append("no result for " + ", ".join(fmt_size(s) for s in r["sizes_missing"]))
            if r.get("bad_lines"):
                note.append(f"{r['bad_lines']} unusable JSON line(s) (malformed, wrong N or check FAIL)")
            if r.get("transport_mismatch"):
                note.append("reported transport " + ",".join(map(str, r["transport_mismatch"])))
            if r["status"] == "timeout":
                note.append("killed: its ranks' CPU shows up as foreign")
            if r["status"] != "ok":
                note.append(f"rc={r['rc']}, log {r['log']}")
            out.append(f"| {r['rep']} | {r['np']} | {label} | {r['status']} | {r['wall_s']:.1f} | "
                       f"{r['waited_s']:.0f} | {'yes' if r['quiet'] else 'NO'} | "
                       f"{r['foreign_cpu_pct']:.1f} | {'; '.join(note)} |")
        out.append("")
        return out


def machine_info():
    model = "unknown"
    mem = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / (1 << 20):.1f} GiB"
    except OSError:
        pass
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            cc = f.read().strip()
    except OSError:
        cc = "?"
    return dict(nproc=os.cpu_count(), cpu=model, memory=mem,
                kernel=platform.release(), os=platform.platform(terse=True), tcp_cc=cc)


DOC_HEAD = """\
# Benchmarks: dshim vs gloo vs OpenMPI (allreduce, one machine)

This file is written by `bench/run_bench.py` (`make bench`); do not edit the
numbers by hand, re-run the harness.

## How to run

```bash
# full comparison (about 10-15 min on 2 cores)
python3 bench/run_bench.py --build build --venv .venv --np 2,4 \\
    --sizes 4K,64K,1M,16M,64M --reps 3 --out docs/benchmarks.md
# smoke run: 1 rep, N=2, sizes 4K and 1M; writes build/bench/benchmarks-quick.md
# unless --out is given
python3 bench/run_bench.py --build build --venv .venv --quick
```

Other options: `--impls dshim-shm,dshim-tcp,gloo,openmpi-shm,openmpi-tcp,wire-tcp`
(subset), `--timeout S` (per run, default 300), `--min-time S` (timed seconds
per size, forwarded as `-t`; default: each benchmark's own 1 s),
`--busy-max`, `--quiet-secs`, `--max-wait` (quiet-machine gate),
`--report-only` (rebuild this file from `build/bench/results.jsonl` and
`runs.jsonl` for the latest, or `--run-id`, run).

What runs, per repetition and per N, in this order:

| label | command |
|---|---|
| dshim shm | `DSHIM_TRANSPORT=shm build/bin/dshim-bench -n N -o allreduce -d float32 -r sum -b MIN -e MAX -f F --in-place -j OUT` |
| dshim tcp | same with `DSHIM_TRANSPORT=tcp DSHIM_SOCKET_IFNAME=lo` |
| gloo (tcp) | `.venv/bin/python bench/gloo_bench.py --np N` (N processes via subprocess, `GLOO_SOCKET_IFNAME=lo`, `OMP_NUM_THREADS=1`, `torch.set_num_threads(1)`) |
| OpenMPI shm | `mpirun --allow-run-as-root --oversubscribe -np N --mca pml ob1 --mca btl vader,self build/bench/mpi_bench` |
| OpenMPI tcp | `mpirun ... --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo build/bench/mpi_bench` |
| TCP wire (bound) | `build/bench/tcp_wire -n N -s SIZES -j OUT` |

`build/bench/mpi_bench` is compiled from `bench/mpi_bench.c` with `mpicc`,
`build/bench/tcp_wire` from `bench/tcp_wire.c` with `cc`, when missing or
older than their source (or the `bench/bench_size.h` they share). dshim-bench takes a geometric sweep
(`-b/-e/-f`): the harness passes the largest factor that covers the requested
sizes and ignores the extra sizes in the tables (they stay in the raw file).
An implementation that is not available (binary not built, torch missing)
is reported as `missing`; a run that fails or times out as `failed`; the
harness still writes this file and exits 0.

## Method

Identical in the three benchmark programs (the TCP wire: same timing, its own
check of the received bytes): float32, SUM, in place; one
correctness check per size (rank+1 values); warm-up of at least 5 iterations
and 0.2 s; then `iters = max(5, ceil(1 s / t_warm))`, capped at 10 000,
decided on rank 0; per-iteration time = **max over ranks**; reported time =
**median over iterations**; `algbw = bytes / time`,
`busbw = algbw × 2(n−1)/n` (nccl-tests definitions). The tables give the
**median over repetitions** of the per-run median time and the busbw derived
from it, with the busbw range over repetitions. The six runs are
interleaved inside every repetition, so drifts of the shared machine affect
all of them. Before each run the harness waits until total CPU busy stays
below the `--busy-max` share for `--quiet-secs` seconds (bounded by
`--max-wait`; a run that started on a busy machine is marked `quiet: NO`).

The TCP wire is not an allreduce: N processes in a ring over loopback TCP,
each sending the 2(N−1)/N × B bytes a ring allreduce must send (B each way at
N = 2; one connection per pair, as dshim) out of a B-byte buffer and
receiving as many into another, with dshim's socket settings (TCP_NODELAY,
4 MiB buffers, `reno`), no reduction, no framing, same timing method. It is
what the kernel alone costs for those bytes: the bound of every TCP column,
measured in the same repetition.

Caveats: N larger than the core count oversubscribes the CPUs, so N=4 on a
2-core machine measures scheduling as much as communication. OpenMPI,
dshim-bench and the TCP wire bind their ranks to cores when not
oversubscribed; gloo's ranks are not pinned. OpenMPI busy-polls; blocking implementations pay the vCPU wake-up
latency at small sizes. Results from 64 MiB up are memory-bandwidth bound
(L3 is smaller than the buffers). On loopback a pacing congestion control
(`bbr`) costs TCP throughput: dshim switches its sockets between ranks of one
host to `reno` (see the table), gloo and OpenMPI keep the system default.
"""


def write_report(bench, runs, rows, out_path):
    summ = Summary(runs, rows, bench.sizes, bench.nps)
    m = machine_info()
    v = bench.versions
    shown = bench.command_line.replace(" && ", "\n", 1)
    lines = [DOC_HEAD, "## This run\n", "```bash", shown, "```\n",
             "| item | value |", "|---|---|",
             f"| date (UTC) | {bench.started} |",
             f"| run id | `{bench.run_id}` (raw: `{rel(bench.results_path)}`, "
             f"`{rel(bench.runs_path)}`) |",
             f"| machine | {m['nproc']} CPUs, {m['cpu']}, {m['memory']} RAM |",
             f"| OS / kernel | {m['os']} / {m['kernel']} |",
             f"| dshim | commit {v.get('dshim commit', '?')} |",
             f"| torch (gloo) | {v.get('torch', 'n/a')} |",
             f"| OpenMPI | {v.get('openmpi', 'n/a')} |",
             f"| compiler | {v.get('gcc', '?')} |",
             f"| TCP congestion control | system default `{m['tcp_cc']}` (gloo, OpenMPI, dshim between "
             f"hosts); dshim between ranks of one host: `reno` (DSHIM_SOCKET_CC=auto) |",
             f"| sweep | N = {', '.join(map(str, bench.nps))}; sizes "
             f"{', '.join(fmt_size(s) for s in bench.sizes)}; {bench.a.reps} repetition(s) |",
             ""]
    miss = sorted({(LABEL[k], bench.avail[k]) for k in ORDER if bench.avail.get(k)})
    if miss:
        lines.append("Not available in this run:\n")
        lines += [f"* {label}: {why}" for label, why in miss]
        lines.append("")
    foreign = [r["foreign_cpu_pct"] for r in runs if r["status"] != "missing"]
    if foreign:
        noisy = sum(1 for r in runs if r["status"] != "missing" and not r["quiet"])
        lines.append(f"Foreign CPU during runs: median {statistics.median(foreign):.1f} %, "
                     f"max {max(foreign):.1f} % of all cores; {noisy} run(s) started on a "
                     f"machine that was not quiet.\n")
    targ, count = summ.targets()
    lines += ["## Results\n"] + summ.tables() + targ + summ.run_log()
    # sections other benchmarks own (bench/ddp_bench.py: "## PyTorch DDP: dshim vs gloo") are kept
    kept = []
    if os.path.exists(out_path):
        with open(out_path) as f:
            old = f.read()
        at = old.find("\n## PyTorch DDP")
        if at >= 0:
            kept = ["", old[at + 1:].rstrip()]
    lines += kept
    os.makedirs(os.path.dirname(os.path.abspath(out_path)) or ".", exist_ok=True)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    os.replace(tmp, out_path)
    return count


def load_previous(bench):
    """--report-only: read back the runs and rows of one earlier run."""
    if not os.path.exists(bench.runs_path):
        raise HarnessError(f"{bench.runs_path} does not exist: run the benchmark first")
    with open(bench.runs_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    all_runs = [r for r in records if r.get("kind", "run") == "run"]
    run_id = bench.a.run_id or (all_runs[-1]["run_id"] if all_runs else None)
    runs = [r for r in all_runs if r["run_id"] == run_id]
    if not runs:
        raise HarnessError(f"no run {run_id!r} in {bench.runs_path}")
    rows = []
    if os.path.exists(bench.results_path):
        with open(bench.results_path) as f:
            rows = [r for r in (json.loads(line) for line in f if line.strip())
                    if r.get("run_id") == run_id]
    bench.run_id = run_id
    meta = next((r for r in records if r.get("kind") == "meta" and r["run_id"] == run_id), None)
    if meta is not None:
        bench.command_line, bench.started = meta["command"], meta["started"]
        bench.versions = dict(meta["versions"])
        bench.sizes, bench.nps, bench.a.reps = meta["sizes"], meta["nps"], meta["reps"]
        for key, why in meta["avail"].items():
            bench.avail[IMPL_KEYS[key]] = why
        return runs, rows
    # an older file without the meta record: infer what it can
    bench.versions.update(bench.tool_versions())
    bench.nps = sorted({r["np"] for r in runs})
    bench.a.reps = max(r["rep"] for r in runs)
    bench.sizes = sorted({r["bytes"] for r in rows if r.get("in_sweep", True)}) or bench.sizes
    for r in runs:
        if r["status"] == "missing":
            bench.avail[(r["impl"], r["transport"])] = r.get("reason", "missing")
    return runs, rows


# ------------------------------------------------------------------ main

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--build", default="build", help="CMake build dir (bin/dshim-bench; bench/ output)")
    ap.add_argument("--venv", default=".venv", help="Python venv with torch, for gloo")
    ap.add_argument("--np", default="2,4", help="comma-separated process counts")
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="comma-separated sizes, K/M/G suffixes")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the whole interleaved sweep")
    ap.add_argument("--out", default=None,
                    help="markdown report (default docs/benchmarks.md; build/bench/benchmarks-quick.md "
                         "with --quick)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 rep, N=2, sizes 4K,1M")
    ap.add_argument("--impls", default=",".join(k for k in IMPL_KEYS if k != "gloo-tcp"),
                    help="subset of " + ",".join(k for k in IMPL_KEYS if k != "gloo-tcp"))
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run before it is killed")
    ap.add_argument("--min-time", type=float, default=None,
                    help="timed seconds per size, forwarded as -t (default: the programs' 1 s)")
    ap.add_argument("--busy-max", type=float, default=0.10,
                    help="quiet means total CPU busy below this share of all cores")
    ap.add_argument("--quiet-secs", type=float, default=2.0, help="for this many seconds in a row")
    ap.add_argument("--max-wait", type=float, default=60.0,
                    help="longest wait for a quiet machine before a run starts anyway")
    ap.add_argument("--results", default=None, help="raw JSON lines (default BUILD/bench/results.jsonl)")
    ap.add_argument("--report-only", action="store_true",
                    help="do not run; rebuild --out from the raw files of --run-id (default: latest)")
    ap.add_argument("--run-id", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.quick:
        a.reps, a.sizes, a.np = QUICK["reps"], QUICK["sizes"], QUICK["np"]
    if a.out is None:
        a.out = (os.path.join(a.build, "bench", "benchmarks-quick.md") if a.quick
                 else os.path.join("docs", "benchmarks.md"))
    try:
        a.size_list = sorted({parse_size(s) for s in a.sizes.split(",") if s.strip()})
        a.np_list = sorted({int(x) for x in a.np.split(",") if x.strip()})
    except ValueError as e:
        ap.error(str(e))
    if not a.size_list or not a.np_list or min(a.np_list) < 2:
        ap.error("need at least one size and process counts >= 2")
    if a.reps < 1 or a.timeout <= 0:
        ap.error("--reps and --timeout must be positive")
    try:
        a.impl_list = {IMPL_KEYS[k.strip()] for k in a.impls.split(",") if k.strip()}
    except KeyError as e:
        ap.error(f"unknown implementation {e}; choose from {', '.join(IMPL_KEYS)}")
    return a


def on_sigterm(signum, frame):
    # same clean-up as Ctrl-C: the run in progress is stopped by run_one
    raise KeyboardInterrupt


def main(argv):
    args = parse_args(argv[1:])
    signal.signal(signal.SIGTERM, on_sigterm)
    bench = Bench(args)
    try:
        if args.report_only:
            runs, rows = load_previous(bench)
        else:
            bench.probe()
            for key in ORDER:
                if bench.avail.get(key) and key in args.impl_list:
                    print(f"{LABEL[key]}: missing ({bench.avail[key]})", flush=True)
            runs, rows = bench.run_all()
        count = write_report(bench, runs, rows, args.out)
    except KeyboardInterrupt:
        print("\nrun_bench: interrupted; the run in progress was stopped, no report written",
              file=sys.stderr)
        return 130
    except (HarnessError, OSError) as e:
        print(f"run_bench: {e}", file=sys.stderr)
        return 1
    except Exception:  # a bug here must not look like a benchmark result
        traceback.print_exc()
        return 1
    print(f"wrote {args.out}: targets " + ", ".join(f"{count.get(k, 0)} {k}"
          for k in ("PASS", "FAIL", "missing or failed", "not measured")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
