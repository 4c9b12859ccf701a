#!/usr/bin/env python3
"""How cost grows with the number of ranks: dshim vs OpenMPI vs gloo, N = 2 ... 64 on one machine.

    python3 bench/scale_bench.py --build build --venv .venv --np 2,4,8,16,32,64 --reps 3 \\
        --out docs/benchmarks.md --plot docs/bench-scale.png          (make bench-scale)

For every repetition and every N, one after the other (interleaved, so drifts
of the shared machine hit all three alike):

  dshim    build/bin/dshim-bench -n N --barrier -b 4K -e 1M -f 256 -t T
           (DSHIM_TRANSPORT unset: auto, i.e. shared memory between ranks of one host)
  OpenMPI  mpirun --oversubscribe -np N --mca pml ob1 --mca btl vader,self
           build/bench/mpi_bench -T shm -B -s 4K,1M -t T
  gloo     .venv/bin/python bench/gloo_bench.py --np N --barrier --sizes 4K,1M -t T
           (only while N <= --gloo-max-np and the previous gloo run took less than --gloo-budget s)

Each program reports its start-up (dshim_comm_init_env / MPI_Init /
init_process_group: each rank times its own call, max over ranks), barrier
latency and the 4 KiB and 1 MiB allreduce (median over iterations of the
per-iteration max over ranks), in JSON lines.  The ranks oversubscribe the
2 cores from N = 4 on: that is the point, it shows what grows with N.

Then, once per N, a start-up census of dshim (not timed): the N ranks of one
dshim-bench job are started by this script, ranks 1..N-1 reach rank 0's store
through a counting proxy (the store's wire protocol, docs/wire-protocol.md §1:
every request's kind and key), and after start-up every rank's TCP sockets
(/proc/PID/fd + /proc/net/tcp) and mapped shared-memory inboxes
(/proc/PID/maps) are counted.  No environment variable or library change is
involved: the ranks run the same code as in the timed runs.

Raw records go to BUILD/bench/scale_results.jsonl; --report-only rebuilds the
section and the plot from the latest run there.  The section "## Scaling with
the number of ranks" of --out is replaced (or appended); the rest of the file
stays.  Every run is bounded (--timeout), and only processes this script
started are stopped.
"""
import argparse
import datetime
import json
import math
import os
import shlex
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from run_bench import (STRIP_ENV, STRIP_ENV_PREFIXES, cpu_jiffies, fmt_time, kill_tree,  # noqa: E402
                       machine_info, rel, wait_quiet)
from ddp_bench import replace_section  # noqa: E402

SECTION = "## Scaling with the number of ranks"
IMPLS = ("dshim", "openmpi", "gloo")
LABEL = {"dshim": "dshim (shm)", "openmpi": "OpenMPI (vader shm)", "gloo": "gloo (tcp)"}
METRICS = (("init", "start-up"), ("barrier", "barrier"), ("4k", "4 KiB allreduce"),
           ("1m", "1 MiB allreduce"))
# rows of the table: the plotted metrics, and start-up's min over ranks (the last rank to arrive
# waits for nobody: what is left is its own work)
TABLE_METRICS = METRICS[:1] + (("init_min", "start-up, min over ranks"),) + METRICS[1:]
KIB, MIB = 1 << 10, 1 << 20
STORE_KINDS = {1: "SET", 2: "GET", 3: "TRY_GET", 4: "ADD", 5: "SET_IF_ABSENT", 6: "DELETE"}


# ------------------------------------------------------------------ runs

def clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in STRIP_ENV and not k.startswith(STRIP_ENV_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"
    return env


def build_mpi_bench(build):
    """build/bench/mpi_bench from bench/mpi_bench.c when missing or older (as run_bench.py does)."""
    src = os.path.join(HERE, "mpi_bench.c")
    exe = os.path.join(build, "bench", "mpi_bench")
    if os.path.exists(exe) and os.path.getmtime(exe) >= os.path.getmtime(src):
        return exe, None
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    cmd = ["mpicc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE",
           "-o", exe, src, "-lm"]
    print("+ " + shlex.join(cmd), flush=True)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return exe, f"mpicc: {e}"
    if out.returncode != 0:
        return exe, "mpicc failed on bench/mpi_bench.c: " + (out.stderr.strip().splitlines() or ["?"])[-1]
    return exe, None


def command(a, impl, n, json_path, mpi_exe):
    mt = str(a.min_time)
    if impl == "dshim":
        return [os.path.join(a.build, "bin", "dshim-bench"), "-n", str(n), "--barrier", "-o", "allreduce",
                "-d", "float32", "-r", "sum", "-b", "4K", "-e", "1M", "-f", "256", "--in-place", "-t", mt, "-j", json_path]
    if impl == "openmpi":
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), "--mca", "pml", "ob1",
                "--mca", "btl", "vader,self", mpi_exe, "-T", "shm", "-B", "-s", "4K,1M", "-t", mt,
                "-j", json_path]
    return [os.path.join(a.venv, "bin", "python"), os.path.join(HERE, "gloo_bench.py"), "--np", str(n),
            "--barrier", "--sizes", "4K,1M", "-t", mt, "-j", json_path,
            "--timeout", str(max(10, int(a.timeout) - 5))]


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_one(a, run_id, log_dir, rep, n, impl, mpi_exe):
    name = f"rep{rep}-np{n}-{impl}"
    json_path = os.path.join(log_dir, name + ".jsonl")
    log_path = os.path.join(log_dir, name + ".log")
    cmd = command(a, impl, n, json_path, mpi_exe)
    rec = dict(kind="run", run_id=run_id, rep=rep, np=n, impl=impl, cmd=shlex.join(cmd), log=rel(log_path))
    rec.update(wait_quiet(a.busy_max, a.quiet_secs, a.max_wait))
    rec["load1_before"] = loadavg()
    print(f"[rep {rep} np {n:>2}] {LABEL[impl]:<20} (waited {rec['waited_s']:.0f}s, "
          f"{'quiet' if rec['quiet'] else 'NOT quiet'}, load {rec['load1_before']:.2f}) ...", end="", flush=True)
    j0, r0, w0 = cpu_jiffies(), os.times(), time.monotonic()
    status = "ok"
    with open(log_path, "w") as log:
        log.write("+ " + rec["cmd"] + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, env=clean_env(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            rc = proc.wait(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            rc, status = proc.returncode, "timeout"
        except KeyboardInterrupt:
            kill_tree(proc)
            raise
    wall = time.monotonic() - w0
    j1, r1 = cpu_jiffies(), os.times()
    hz = os.sysconf("SC_CLK_TCK")
    busy = ((j1[0] - j0[0]) - (j1[1] - j0[1])) / hz
    own = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    foreign = max(0.0, busy - own) / (max(wall, 1e-3) * (os.cpu_count() or 1)) * 100
    if status == "ok" and rc != 0:
        status = "failed"
    rows = []
    if os.path.exists(json_path):
        with open(json_path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if int(r.get("np", -1)) != n or str(r.get("check", "ok")).upper() == "FAIL":
                    continue
                rows.append(r)
    vals = {}
    for r in rows:
        if r.get("op") == "barrier":
            vals["barrier"] = float(r["time_us"])
        elif int(r.get("bytes", 0)) == 4 * KIB:
            vals["4k"] = float(r["time_us"])
        elif int(r.get("bytes", 0)) == MIB:
            vals["1m"] = float(r["time_us"])
        if "init_us" in r:
            vals["init"] = float(r["init_us"])
            vals["init_span"] = float(r["init_span_us"])
            vals["init_min"] = float(r["init_min_us"])
    if status == "ok" and not all(k in vals for k, _ in METRICS):
        status = "partial"
    rec.update(status=status, rc=rc, wall_s=round(wall, 2), foreign_cpu_pct=round(foreign, 1),
               load1_after=loadavg(), **{f"v_{k}": v for k, v in vals.items()})
    print(f" {status} in {wall:.1f}s, foreign CPU {foreign:.0f}%", flush=True)
    return rec


# --------------------------------------------------------------- census

def free_port(avoid=()):
    """A port in 20000-31999 (below the ephemeral range, as the tests pick theirs)."""
    import random
    rnd = random.Random(os.getpid() ^ int(time.time()))
    for _ in range(200):
        p = rnd.randint(20000, 31999)
        if p in avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue
    raise RuntimeError("no free port in 20000-31999")


class CountingProxy:
    """TCP proxy in front of the store that parses what clients send (wire-protocol §1)."""

    def __init__(self, listen_port, target_port):
        self.target = target_port
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", listen_port))
        self.lsock.listen(256)
        self.lock = threading.Lock()
        self.conns = []     # per client connection: list of (t, kind, key)
        self.stop = False
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        self.lsock.settimeout(0.2)
        while not self.stop:
            try:
                c, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            # a rank may come before rank 0 listens: retry refusals as the store client does
            # (closing the rank's connection instead would read as "store gone" and end it)
            s, until = None, time.monotonic() + 60
            while s is None and not self.stop and time.monotonic() < until:
                try:
                    s = socket.create_connection(("127.0.0.1", self.target), timeout=10)
                except OSError:
                    time.sleep(0.02)
            if s is None:
                c.close()
                continue
            s.settimeout(None)
            log = []
            with self.lock:
                self.conns.append(log)
            threading.Thread(target=self.up, args=(c, s, log), daemon=True).start()
            threading.Thread(target=self.down, args=(s, c), daemon=True).start()

    @staticmethod
    def down(s, c):
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                c.sendall(b)
        except OSError:
            pass
        for x in (c, s):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @staticmethod
    def up(c, s, log):
        buf = b""
        need_hello = True
        try:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                s.sendall(b)
                buf += b
                while True:
                    if need_hello:
                        if len(buf) < 12:
                            break
                        tlen = struct.unpack_from("<I", buf, 8)[0]
                        if len(buf) < 12 + tlen:
                            break
                        buf = buf[12 + tlen:]
                        need_hello = False
                        continue
                    if len(buf) < 24:
                        break
                    kind, _seq, klen, _arg, vlen = struct.unpack_from("<IIIIQ", buf, 0)
                    if len(buf) < 24 + klen + vlen:
                        break
                    key = buf[24:24 + klen].decode("latin-1")
                    log.append((time.monotonic(), STORE_KINDS.get(kind, str(kind)), key))
                    buf = buf[24 + klen + vlen:]
        except OSError:
            pass
        for x in (c, s):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.lsock.close()


def tcp_table():
    """inode -> (state, local port, remote port) for every IPv4/IPv6 TCP socket."""
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    p = line.split()
                    lport = int(p[1].rsplit(":", 1)[1], 16)
                    rport = int(p[2].rsplit(":", 1)[1], 16)
                    out[p[9]] = (int(p[3], 16), lport, rport)
        except OSError:
            pass
    return out


def sockets_of(pid, table):
    """(established TCP sockets, listening TCP sockets, [remote ports]) of one process."""
    est, lst, rports = 0, 0, []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith("socket:["):
            e = table.get(t[8:-1])
            if e is None:
                continue
            if e[0] == 1:       # TCP_ESTABLISHED
                est += 1
                rports.append(e[2])
            elif e[0] == 10:    # TCP_LISTEN
                lst += 1
    return est, lst, rports


def shm_maps(pid):
    """Distinct /dev/shm/dshim-* segments mapped by pid, and their mapped bytes."""
    segs, size = set(), 0
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                p = line.split()
                # shared mappings of inbox files (DSHIM_SHM_DIR, default /dev/shm; the files are
                # unlinked right after creation, so the line ends in "(deleted)")
                if len(p) >= 6 and p[1].endswith("s") and os.path.basename(p[5]).startswith("dshim-"):
                    lo, hi = (int(x, 16) for x in p[0].split("-"))
                    segs.add(p[5])
                    size += hi - lo
    except OSError:
        pass
    return len(segs), size


def census_one(a, n, log_dir):
    """One dshim-bench job of n ranks started here; counts store requests and connections."""
    store_port = free_port()
    proxy_port = free_port(avoid=(store_port,))
    proxy = CountingProxy(proxy_port, store_port)
    exe = os.path.join(a.build, "bin", "dshim-bench")
    argv = [exe, "--barrier", "-b", "4K", "-e", "1M", "-f", "256", "-t", "0.3"]
    token = f"scale-census-{os.getpid()}-{n}"
    procs = []
    log_path = os.path.join(log_dir, f"census-np{n}.log")
    rec = dict(kind="census", np=n, log=rel(log_path))
    t_start = time.monotonic()
    log = open(log_path, "w")
    try:
        for r in range(n):
            env = clean_env()
            env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(store_port if r == 0 else proxy_port), DSHIM_JOB_TOKEN=token)
            procs.append(subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE if r == 0 else log, stderr=log, text=True))
        # rank 0 prints "# init:" once every rank has returned from dshim_comm_init_env
        deadline = time.monotonic() + a.timeout
        t_init = None
        head = []
        while time.monotonic() < deadline:
            line = procs[0].stdout.readline()
            if not line:
                break
            head.append(line)
            if line.startswith("# init:"):
                t_init = time.monotonic()
                break
        if t_init is None:
            raise RuntimeError("rank 0 did not report its start-up")
        time.sleep(0.1)
        table = tcp_table()
        per_rank = []
        for r, p in enumerate(procs):
            s = sockets_of(p.pid, table)
            segs, mapped = shm_maps(p.pid)
            if s is None:
                continue
            est, lst, rports = s
            to_store = sum(1 for x in rports if x in (store_port, proxy_port))
            per_rank.append(dict(rank=r, tcp_established=est, tcp_listen=lst, tcp_to_store=to_store,
                                 shm_segments=segs, shm_mapped_mib=round(mapped / MIB, 1)))
        rest = procs[0].stdout.read()
        for p in procs:
            left = max(1.0, deadline - time.monotonic())
            p.wait(timeout=left)
        log.write("".join(head) + rest)
        rec["rc"] = [p.returncode for p in procs]
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        rec["error"] = str(e)
        per_rank = []
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p)
        log.close()
        time.sleep(0.2)
        proxy.close()
    rec["wall_s"] = round(time.monotonic() - t_start, 2)
    # store requests, per client connection (ranks 1..n-1 come through the proxy)
    with proxy.lock:
        conns = [list(c) for c in proxy.conns]
    startup, total, kinds, keys = [], [], {}, {}
    t_cut = t_init if t_init is not None else float("inf")
    for c in conns:
        if not c:
            continue
        total.append(len(c))
        early = [x for x in c if x[0] <= t_cut]
        startup.append(len(early))
        for _, kind, key in early:
            kinds[kind] = kinds.get(kind, 0) + 1
            k = key[3:] if key.startswith("c0/") else key
            k = "peer/R" if k.startswith("peer/") else k
            keys[f"{kind} {k}"] = keys.get(f"{kind} {k}", 0) + 1
    ranks_seen = len(conns)
    rec.update(store_conns=ranks_seen, store_startup=startup, store_total=total, store_kinds=kinds,
               store_keys=keys, per_rank=per_rank)
    if per_rank:
        others = [x for x in per_rank if x["rank"] != 0]
        mesh = [x["tcp_established"] - x["tcp_to_store"] for x in others] or [0]
        rec.update(mesh_min=min(mesh), mesh_max=max(mesh),
                   rank0_established=per_rank[0]["tcp_established"],
                   shm_segments=max(x["shm_segments"] for x in per_rank),
                   shm_mapped_mib=max(x["shm_mapped_mib"] for x in per_rank))
    print(f"[census np {n:>2}] store connections {ranks_seen}, start-up requests per rank "
          f"{min(startup) if startup else '?'}..{max(startup) if startup else '?'}, data connections per rank "
          f"{rec.get('mesh_min', '?')}..{rec.get('mesh_max', '?')}, shm inboxes mapped "
          f"{rec.get('shm_segments', '?')} ({rec.get('error', 'ok')})", flush=True)
    return rec


def shm_leftovers(before):
    try:
        now = {x for x in os.listdir("/dev/shm") if x.startswith("dshim-")}
    except OSError:
        return []
    return sorted(now - before)


# ---------------------------------------------------------------- report

def med(v):
    return statistics.median(v) if v else None


def fmt_us(us):
    return "—" if us is None else fmt_time(us)


def slope(ns, vs):
    """Least-squares exponent k of v ~ N^k over the points given."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, vs) if v and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


class Report:
    def __init__(self, meta, runs, census):
        self.meta, self.runs, self.census = meta, runs, census
        self.nps = meta["nps"]
        self.val = {}   # (impl, n, metric) -> median over reps
        self.reps = {}
        for impl in IMPLS:
            for n in self.nps:
                rs = [r for r in runs if r["impl"] == impl and r["np"] == n]
                for key, _ in TABLE_METRICS + (("init_span", ""),):
                    v = [r[f"v_{key}"] for r in rs if f"v_{key}" in r]
                    self.val[(impl, n, key)] = med(v)
                    self.reps[(impl, n, key)] = v
        self.status = {}
        for r in runs:
            self.status.setdefault((r["impl"], r["np"]), []).append(r["status"])

    def cell(self, impl, n, key):
        v = self.val.get((impl, n, key))
        if v is None:
            st = self.status.get((impl, n))
            if not st:
                return "not run"
            return "/".join(sorted(set(st)))
        rs = self.reps[(impl, n, key)]
        spread = f" [{fmt_time(min(rs))}–{fmt_time(max(rs))}]" if len(rs) > 1 else ""
        return f"{fmt_time(v)}{spread}"

    def ratio(self, n, key):
        d, o = self.val.get(("dshim", n, key)), self.val.get(("openmpi", n, key))
        if d is None or o is None:
            return "—"
        return f"{d / o:.2f}"

    def exponents(self, impl, key, lo=8):
        ns = [n for n in self.nps if n >= lo and self.val.get((impl, n, key))]
        return slope(ns, [self.val[(impl, n, key)] for n in ns]), ns

    def plot(self, path):
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            print(f"scale_bench: no plot ({e}); `make setup` installs matplotlib into .venv", file=sys.stderr)
            return False
        fig, axes = plt.subplots(2, 2, figsize=(11, 8))
        style = {"dshim": ("tab:blue", "o"), "openmpi": ("tab:orange", "s"), "gloo": ("tab:green", "^")}
        for ax, (key, title) in zip(axes.flat, METRICS):
            for impl in IMPLS:
                ns = [n for n in self.nps if self.val.get((impl, n, key))]
                if not ns:
                    continue
                vs = [self.val[(impl, n, key)] for n in ns]
                c, m = style[impl]
                ax.plot(ns, vs, marker=m, color=c, label=LABEL[impl])
                for n in ns:
                    rs = self.reps[(impl, n, key)]
                    if len(rs) > 1:
                        ax.vlines(n, min(rs), max(rs), color=c, alpha=0.4)
            # guides: N and N^2 through dshim's N=8 point
            base = self.val.get(("dshim", 8, key))
            if base:
                xs = [n for n in self.nps if n >= 8]
                ax.plot(xs, [base * n / 8 for n in xs], ":", color="grey", lw=1, label="∝ N")
                ax.plot(xs, [base * (n / 8) ** 2 for n in xs], "--", color="grey", lw=1, label="∝ N²")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(self.nps)
            ax.set_xticklabels([str(n) for n in self.nps])
            ax.set_xlabel("ranks N (2 cores: oversubscribed from N = 4)")
            ax.set_ylabel("µs (median over reps)")
            ax.set_title(title + (" (max over ranks)" if key == "init" else ""))
            ax.grid(True, which="both", alpha=0.3)
        axes.flat[0].legend(fontsize=8)
        fig.suptitle(f"dshim vs OpenMPI vs gloo, one 2-core machine, run {self.meta['run_id']}")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return True

    def text(self, plot_rel):
        m, meta = machine_info(), self.meta
        out = [SECTION, "",
               "Written by `bench/scale_bench.py` (`make bench-scale`); do not edit the numbers by hand.",
               "How start-up, barrier and allreduce time grow with the number of ranks N when all",
               "of them share one 2-core machine (from N = 4 on the ranks oversubscribe the cores:",
               "that is the point, every extra rank is another process to schedule).", "",
               "```bash", meta["command"], "```", "",
               "| item | value |", "|---|---|",
               f"| date (UTC) | {meta['started']} |",
               f"| run id | `{meta['run_id']}` (raw: `{meta['raw']}`) |",
               f"| machine | {m['nproc']} CPUs, {m['cpu']}, {m['memory']} RAM |",
               f"| dshim | commit {meta['versions'].get('dshim commit', '?')}, `dshim-bench -n N --barrier -b 4K "
               f"-e 1M -f 256 -t {meta['min_time']}` (transport auto = shm) |",
               f"| OpenMPI | {meta['versions'].get('openmpi', '?')}, `mpirun --oversubscribe -np N --mca pml ob1 "
               f"--mca btl vader,self build/bench/mpi_bench -T shm -B -s 4K,1M -t {meta['min_time']}` |",
               f"| gloo | torch {meta['versions'].get('torch', '?')}, `bench/gloo_bench.py --np N --barrier "
               f"--sizes 4K,1M -t {meta['min_time']}`, only N ≤ {meta['gloo_max_np']} (and only while the "
               f"previous gloo run took < {meta['gloo_budget']:.0f} s): 16 Python processes that import "
               "torch already take most of a minute on 2 cores |",
               f"| sweep | N = {', '.join(map(str, self.nps))}; {meta['reps']} repetition(s), interleaved "
               "(dshim, OpenMPI, gloo, then the next N) |",
               ""]
        foreign = [r["foreign_cpu_pct"] for r in self.runs if "foreign_cpu_pct" in r]
        loads = [r["load1_before"] for r in self.runs if "load1_before" in r]
        noisy = sum(1 for r in self.runs if not r.get("quiet", True))
        if foreign:
            out += [f"Machine load during the runs: foreign CPU (busy time of processes other than the run) "
                    f"median {statistics.median(foreign):.0f} %, max {max(foreign):.0f} % of both cores; "
                    f"1-minute load average before a run median {statistics.median(loads):.2f}, "
                    f"max {max(loads):.2f} (it decays slowly and still counts the previous run's ranks, up "
                    f"to 64: foreign CPU is the measure of other work); {noisy} of {len(self.runs)} run(s) started on a machine that "
                    f"was not quiet (busy ≥ {meta['busy_max'] * 100:.0f} % after waiting up to "
                    f"{meta['max_wait']:.0f} s). Other work sharing the machine makes the absolute numbers "
                    "noisy; the dshim/OpenMPI ratios come from runs of the same sitting, seconds apart.", ""]
        out += ["Method: each program times its own start-up call in every rank (`dshim_comm_init_env`, "
                "`MPI_Init`, `init_process_group`; the table gives the max over ranks: the first rank "
                "waits for the last one to arrive, so this is the job's start-up as a user sees it, not "
                "counting process launch or `import torch`). Barrier and allreduce (float32 sum, in place) "
                "as in `make bench`: warm-up, then ≥ 5 iterations and ≥ the timed seconds, per-iteration "
                "time = max over ranks, median over iterations; cells give the median over repetitions "
                "[min–max]. `ratio` = dshim ÷ OpenMPI (lower is better).", ""]
        out += [f"![start-up, barrier, 4 KiB and 1 MiB allreduce against N]({plot_rel})", ""]
        out += ["| N | what | " + " | ".join(LABEL[i] for i in IMPLS) + " | ratio dshim/OpenMPI |",
                "|---:|---|" + "---|" * len(IMPLS) + "---:|"]
        for n in self.nps:
            for key, title in TABLE_METRICS:
                extra = ""
                if key == "1m":
                    d = self.val.get(("dshim", n, key))
                    o = self.val.get(("openmpi", n, key))
                    bf = 2.0 * (n - 1) / n
                    extra = " (busbw GB/s: " + ", ".join(
                        f"{LABEL[i].split()[0]} {MIB / v / 1e3 * bf:.2f}" for i, v in
                        (("dshim", d), ("openmpi", o), ("gloo", self.val.get(("gloo", n, key))))
                        if v) + ")"
                out.append(f"| {n} | {title}{extra} | "
                           + " | ".join(self.cell(i, n, key) for i in IMPLS) + f" | {self.ratio(n, key)} |")
        out.append("")
        out += ["Growth exponents: least-squares k in time ∝ N^k over N = 8…"
                f"{max(self.nps)} (the oversubscribed range; 1 = linear, 2 = quadratic):", "",
                "| what | " + " | ".join(LABEL[i] for i in IMPLS) + " |", "|---|" + "---|" * len(IMPLS)]
        for key, title in TABLE_METRICS:
            cells = []
            for impl in IMPLS:
                k, ns = self.exponents(impl, key)
                cells.append("—" if k is None else f"{k:.2f} (N = {ns[0]}…{ns[-1]})")
            out.append(f"| {title} | " + " | ".join(cells) + " |")
        out.append("")
        if self.census:
            out += ["### dshim start-up census: store requests and connections per rank", "",
                    "One extra (untimed) dshim-bench job per N, started by the script: ranks 1…N−1 reach "
                    "rank 0's store through a proxy that parses every request (kind and key, "
                    "docs/wire-protocol.md §1); after start-up each rank's TCP sockets (`/proc/PID/fd` "
                    "matched with `/proc/net/tcp`) and mapped shared-memory inboxes (`/proc/PID/maps`) are "
                    "counted. Rank 0 hosts the store and talks to it directly, so its requests are not "
                    "counted (it runs the same code).", "",
                    "| N | store requests per rank at start-up | of them GET `peer/R` | whole job (incl. "
                    "destroy) | requests at the store (all ranks, start-up) | data TCP connections per rank "
                    "(excl. store) | rank 0 TCP sockets (incl. the store's) | shm inboxes mapped per rank "
                    "(MiB) |",
                    "|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for c in self.census:
                n = c["np"]
                if c.get("error") or not c.get("store_startup"):
                    out.append(f"| {n} | failed: {c.get('error', 'no data')} | | | | | | |")
                    continue
                su = c["store_startup"]
                gets = c["store_keys"].get("GET peer/R", 0) / max(1, len(su))
                su_txt = f"{min(su)}" if min(su) == max(su) else f"{min(su)}–{max(su)}"
                tot = c["store_total"]
                tot_txt = f"{min(tot)}" if min(tot) == max(tot) else f"{min(tot)}–{max(tot)}"
                all_store = round(statistics.mean(su) * n)
                mesh = (f"{c['mesh_min']}" if c.get("mesh_min") == c.get("mesh_max")
                        else f"{c.get('mesh_min')}–{c.get('mesh_max')}")
                out.append(f"| {n} | {su_txt} | {gets:.0f} | {tot_txt} | ≈ {all_store} | {mesh} | "
                           f"{c.get('rank0_established', '?')} | {c.get('shm_segments', '?')} "
                           f"({c.get('shm_mapped_mib', '?')}) |")
            good = [x for x in self.census if x.get("store_keys") and not x.get("error")]
            last = good[-1] if good else {}
            if last.get("store_keys"):
                per = max(1, len(last["store_startup"]))
                out += ["", f"Start-up requests of one rank at N = {last['np']}, by kind and key "
                        "(per rank, `c0/` prefix dropped): " + ", ".join(
                            f"`{k}` × {v / per:.3g}" for k, v in sorted(last["store_keys"].items(),
                                                                     key=lambda kv: -kv[1])) + "."]
            out.append("")
        out += self.explain()
        return "\n".join(out) + "\n"

    def ratio_range(self, key):
        r = [self.val[("dshim", n, key)] / self.val[("openmpi", n, key)] for n in self.nps
             if self.val.get(("dshim", n, key)) and self.val.get(("openmpi", n, key))]
        return f"{min(r):.1f}–{max(r):.1f}" if r else "?"

    def top_exponent(self, impl, key):
        ns = [n for n in self.nps if n >= max(self.nps) // 4 and self.val.get((impl, n, key))]
        e = slope(ns, [self.val[(impl, n, key)] for n in ns])
        return "—" if e is None else f"{e:.2f}"

    def gloo_range(self):
        r = [self.val[("gloo", n, key)] / self.val[("dshim", n, key)] for n in self.nps
             for key, _ in METRICS[1:] if self.val.get(("gloo", n, key)) and self.val.get(("dshim", n, key))]
        return f"{min(r):.0f}–{max(r):.0f}×" if r else "(not measured)"

    def explain(self):
        """What grows how, and why: from how dshim works, with this run's numbers."""
        nmax = max(self.nps)
        ok = [x for x in self.census if x.get("store_startup") and not x.get("error")]
        c = max(ok, key=lambda x: x["np"]) if ok else None

        def k(impl, key):
            e, _ = self.exponents(impl, key)
            return "—" if e is None else f"{e:.2f}"

        def v(impl, n, key):
            return fmt_us(self.val.get((impl, n, key)))

        out = ["### What grows with N, and why", ""]
        if c:
            su, cn = c["store_startup"], c["np"]
            out += [f"**Start-up messages: O(N) per rank, O(N²) at the store.** Each rank sends the store "
                    f"N requests: one SET of its peer record (`c0/peer/R`: address, port, pid, host, how to "
                    f"open its shm inbox) and N − 1 GETs of every other rank's record (parked at the store "
                    f"until set, no polling); measured {min(su)}–{max(su)} at N = {cn}, "
                    f"{c['store_keys'].get('GET peer/R', 0) // max(1, len(su))} of them record GETs. That "
                    f"meets the issue's bound (O(N) per rank): the records give every rank the host ids "
                    f"(hierarchy, shm or TCP per pair) without asking anyone, but all N² ≈ "
                    f"{round(statistics.mean(su) * cn)} requests go through one store, one round trip each.",
                    "",
                    f"**Connections: on first use.** `bootstrap.c` connects nothing at init: each rank keeps "
                    f"its data listener open (one listening socket, served by an acceptor thread) and a "
                    f"connection is made, with a HELLO exchange, the first time an operation needs that "
                    f"peer (as NCCL, gloo and UCX do). The census looks 0.1 s after start-up, when the "
                    f"first barriers and 4 KiB allreduces have run (through the host gate: no connection, "
                    f"every rank maps rank 0's inbox), and perhaps the first steps of the 1 MiB ring: "
                    f"{c.get('mesh_max')} data connections per rank at N = {cn}, against N − 1 = {cn - 1} "
                    f"for a full mesh. Recursive doubling over messages connects ⌈log2 N⌉ = "
                    f"{math.ceil(math.log2(cn))} partners, the ring its 2 neighbours, alltoall everyone. Rank 0 holds "
                    f"{c.get('rank0_established')} sockets: its connections, its store client, and the "
                    f"store's end of every rank's connection.", "",
                    f"**Shared memory: one inbox per peer talked to.** Every rank creates an inbox of N "
                    f"rings × 1 MiB (`DSHIM_SHM_RING_SIZE`; rank 0's also the host gate's area, N + 1 blocks "
                    f"of 1 MiB; only pages that carry data are ever allocated) and maps a peer's inbox when "
                    f"it first connects to that peer, and rank 0's for the host gate: "
                    f"{c.get('shm_segments')} segments, "
                    f"{c.get('shm_mapped_mib', 0):.0f} MiB of address space per rank at N = {cn} (a full "
                    f"mesh would map N: N² MiB). The files are unlinked as soon as they are created "
                    f"(peers open them through the owner's descriptor): nothing is ever left in /dev/shm.",
                    ""]
        out += [f"**Start-up time** (max over ranks: exponent {k('dshim', 'init')} for dshim, "
                f"{k('openmpi', 'init')} for OpenMPI over N = 8…{nmax}; "
                f"{v('dshim', nmax // 2, 'init')} at N = {nmax // 2}, {v('dshim', nmax, 'init')} at "
                f"N = {nmax}; exponent {self.top_exponent('dshim', 'init')} over N = {nmax // 4}…{nmax}). "
                f"It is not the wait for the last process to be launched: the min over "
                f"ranks (the last rank to arrive, which waits for nobody) is {v('dshim', nmax, 'init_min')} "
                f"at N = {nmax}. Per rank the work is O(N): N − 1 record GETs, one listener, one inbox "
                f"and the acceptor thread; no connection (they are made on first use, inside the first "
                f"operations, and cost one HELLO round trip each). The store serves its N² requests "
                f"one by one, so the job's start-up still grows faster than N at the top of the range; "
                f"at small N fixed costs (threads, the first store connection, process start-up) hide "
                f"it. "
                f"`MPI_Init` takes {v('openmpi', nmax, 'init')} at N = {nmax} (ratio dshim/OpenMPI "
                f"{self.ratio(nmax, 'init')}).", "",
                f"**Barrier and 4 KiB allreduce** (exponents {k('dshim', 'barrier')} and "
                f"{k('dshim', '4k')} for dshim, {k('openmpi', 'barrier')} and {k('openmpi', '4k')} for "
                f"OpenMPI): every rank of one host meets in the host gate (`host_gate.c`): it writes its "
                f"call (and its 4 KiB) into rank 0's shared memory and adds 1 to a counter; the last to "
                f"arrive reduces the N blocks in rank order and opens the gate, and every rank copies the "
                f"result out. One round whatever N (the allreduce from N = 3 on this machine, where ranks "
                f"outnumber cores; at N = 2 it is recursive doubling, one exchange). With N ranks on 2 "
                f"cores each must run once to arrive and once more to see the gate open (or the same "
                f"turn, when it is still spinning): ~N/2 context switches per core, linear in N, plus the "
                f"last rank's pass over N·4 KiB. A waiting rank spins for DSHIM_SPIN_US (50 us) times the "
                f"ranks per core, yielding the core on every poll (the late ranks need it), then sleeps on "
                f"a futex in the gate, which the last rank wakes only if someone sleeps. OpenMPI's are "
                f"trees of messages (its barrier by recursive doubling from 8 ranks, linear below; its "
                f"allreduce by recursive doubling): ⌈log2 N⌉ rounds, each needing every rank to run: "
                f"N·log N, and OpenMPI busy-polls with `sched_yield` and never sleeps. (Across hosts, or "
                f"with DSHIM_SHM_GATE=0, dshim's are messages too: a dissemination barrier and recursive "
                f"doubling.) dshim's barrier takes {self.ratio_range('barrier')}× OpenMPI's time and its "
                f"4 KiB allreduce {self.ratio_range('4k')}× over N = {self.nps[0]}…{nmax} in this run.", "",
                f"**1 MiB allreduce** (exponent {k('dshim', '1m')} for dshim, {k('openmpi', '1m')} for "
                f"OpenMPI). From N = 3 on this machine (ranks outnumber cores) it goes through the host "
                f"gate split: every rank copies its 1 MiB into rank 0's shared memory and arrives, "
                f"reduces its 1/N of the elements over the N blocks and arrives again, then copies the "
                f"1 MiB result out: two rounds whatever N, where a ring takes 2(N − 1) dependent steps, "
                f"each waiting for a neighbour to be scheduled. Each rank still moves about 3 MiB "
                f"(in, its share of the reduction, out), so the bytes through the 2 cores grow as N, and "
                f"the two rounds' context switches as N per core: about linear, with the copies "
                f"dominating. At N = 2 (a core per rank) it is the pipelined ring, whose steps run on "
                f"both cores at once. OpenMPI's is made of messages (its tuned component picks recursive "
                f"doubling, a ring or Rabenseifner's by size and N), every step of which waits for a "
                f"peer to run. dshim takes {self.ratio_range('1m')}× OpenMPI's "
                f"time here over N = {self.nps[0]}…{nmax}.", "",
                f"gloo (torch, TCP) is {self.gloo_range()} dshim's time at every N it ran and takes "
                "about a second to start (a TCP full mesh through torch's store); it is capped at N = "
                f"{self.meta['gloo_max_np']}.", ""]
        return out


# ------------------------------------------------------------------ main

def tool_versions(venv):
    v = {}

    def first(cmd):
        try:
            o = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            return (o.stdout.strip().splitlines() or [""])[0]
        except (OSError, subprocess.TimeoutExpired):
            return ""
    v["openmpi"] = first(["mpirun", "--version"])
    v["dshim commit"] = first(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]) or "unknown"
    v["torch"] = first([os.path.join(venv, "bin", "python"), "-c", "import torch; print(torch.__version__)"])
    return v


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--build", default="build")
    ap.add_argument("--venv", default=".venv")
    ap.add_argument("--np", default="2,4,8,16,32,64")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.2, help="timed seconds per measurement (-t)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run before it is killed")
    ap.add_argument("--gloo-max-np", type=int, default=16, help="largest N that gloo runs at")
    ap.add_argument("--gloo-budget", type=float, default=90.0,
                    help="no gloo at larger N once a gloo run took longer than this (s)")
    ap.add_argument("--impls", default="dshim,openmpi,gloo")
    ap.add_argument("--no-census", action="store_true", help="skip the start-up census")
    ap.add_argument("--busy-max", type=float, default=0.10)
    ap.add_argument("--quiet-secs", type=float, default=1.0)
    ap.add_argument("--max-wait", type=float, default=5.0,
                    help="longest wait for a quiet machine before a run starts anyway")
    ap.add_argument("--out", default="docs/benchmarks.md")
    ap.add_argument("--plot", default="docs/bench-scale.png")
    ap.add_argument("--report-only", action="store_true",
                    help="do not run; rebuild the section and plot from the latest run in the raw file")
    a = ap.parse_args(argv)
    a.build, a.venv = os.path.abspath(a.build), os.path.abspath(a.venv)
    a.np_list = sorted({int(x) for x in a.np.split(",") if x.strip()})
    a.impl_list = [i for i in IMPLS if i in {x.strip() for x in a.impls.split(",")}]
    if not a.np_list or min(a.np_list) < 2 or a.reps < 1:
        ap.error("need process counts >= 2 and --reps >= 1")
    return a


def main(argv):
    a = parse_args(argv[1:])
    bench_dir = os.path.join(a.build, "bench")
    raw = os.path.join(bench_dir, "scale_results.jsonl")
    if a.report_only:
        with open(raw) as f:
            recs = [json.loads(x) for x in f if x.strip()]
        meta = [r for r in recs if r.get("kind") == "meta"][-1]
        runs = [r for r in recs if r.get("kind") == "run" and r["run_id"] == meta["run_id"]]
        census = [r for r in recs if r.get("kind") == "census" and r.get("run_id") == meta["run_id"]]
    else:
        run_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
        log_dir = os.path.join(bench_dir, "logs", "scale-" + run_id)
        os.makedirs(log_dir, exist_ok=True)
        mpi_exe, why = build_mpi_bench(a.build)
        impls = list(a.impl_list)
        if "openmpi" in impls and why:
            print(f"OpenMPI: missing ({why})", flush=True)
            impls.remove("openmpi")
        if not os.access(os.path.join(a.build, "bin", "dshim-bench"), os.X_OK):
            sys.exit(f"scale_bench: {a.build}/bin/dshim-bench not built (make build)")
        meta = dict(kind="meta", run_id=run_id, nps=a.np_list, reps=a.reps, min_time=a.min_time,
                    gloo_max_np=a.gloo_max_np, gloo_budget=a.gloo_budget, busy_max=a.busy_max,
                    max_wait=a.max_wait, raw=rel(raw),
                    started=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                    command=f"cd {shlex.quote(os.getcwd())}\n{os.path.basename(sys.executable)} "
                            f"{shlex.join(argv)}",
                    versions=tool_versions(a.venv))
        with open(raw, "a") as f:
            f.write(json.dumps(meta) + "\n")
        shm_before = {x for x in os.listdir("/dev/shm") if x.startswith("dshim-")}
        runs, census = [], []
        gloo_slow_at = None
        t0 = time.monotonic()
        try:
            for rep in range(1, a.reps + 1):
                for n in a.np_list:
                    for impl in impls:
                        if impl == "gloo" and (n > a.gloo_max_np or (gloo_slow_at and n > gloo_slow_at)):
                            continue
                        rec = run_one(a, run_id, log_dir, rep, n, impl, mpi_exe)
                        runs.append(rec)
                        if impl == "gloo" and rec["wall_s"] > a.gloo_budget:
                            gloo_slow_at = n if gloo_slow_at is None else min(gloo_slow_at, n)
                        with open(raw, "a") as f:
                            f.write(json.dumps(rec) + "\n")
            if not a.no_census and "dshim" in impls:
                for n in a.np_list:
                    c = census_one(a, n, log_dir)
                    c["run_id"] = run_id
                    census.append(c)
                    with open(raw, "a") as f:
                        f.write(json.dumps(c) + "\n")
        except KeyboardInterrupt:
            print("\nscale_bench: interrupted; the run in progress was stopped, no report written",
                  file=sys.stderr)
            return 130
        left = shm_leftovers(shm_before)
        if left:
            print(f"scale_bench: WARNING: new files in /dev/shm after the runs: {left}", file=sys.stderr)
        print(f"scale_bench: all runs took {time.monotonic() - t0:.0f} s", flush=True)
    rep = Report(meta, runs, census)
    plot_ok = rep.plot(a.plot)
    plot_rel = os.path.relpath(os.path.abspath(a.plot), os.path.dirname(os.path.abspath(a.out)))
    text = rep.text(plot_rel if plot_ok else "(no plot: matplotlib missing)")
    replace_section(a.out, text, SECTION)
    print(f"wrote section '{SECTION}' of {a.out}" + (f" and {a.plot}" if plot_ok else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
