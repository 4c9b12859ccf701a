#!/usr/bin/env python3
"""soak.py -- a seeded random fault soak over real dshim jobs.

Each run starts one job through dshim-run and injects at most one fault once every worker has
done its first step:

  torch-none      3-4 ranks (dshim-run --nproc-per-node N tests/soak/torch_job.py): no fault; every
                  all_reduce result is checked, every rank must say dshim carried the group
  mx-none         MXNet dist_sync, 2 workers + 2 servers (dshim-run -n 2 -s 2 tests/soak/mx_job.py)
  torch-kill      kill -9 of a random rank
  mx-kill         kill -9 of a random role: worker, server or the scheduler
  torch-stop      SIGSTOP of a random rank (never continued), with DSHIM_TIMEOUT=5
  torch-garbage   random bytes, wrong-token hellos of the three dshim protocols (store, data mesh,
  mx-garbage      parameter server), HTTP, a 4 GiB length field and connect-then-close, to every TCP
                  port the job's processes listen on, while it runs: it must finish with the right
                  results, and the rejections must be logged
  torch-netcut    2 network-namespace hosts with sshd (tests/launcher/lib/hosts.sh), dshim-run -H
                  --nnodes 2 --nproc-per-node 2, then `ip link set eth0 down` on host 1 (root only)

After a fault: dshim-run exits non-zero, its output names the culprit (rank/role, pid, signal, or
the rank that did not arrive), every process of the job is gone within DSHIM_TIMEOUT + 2 s of the
fault, and no /dev/shm segment made by a process of the job is left.  After every run nothing of the
job may remain.  Processes are recognised by DSHIM_SOAK_MARKER=<uuid> in their environment (plus
what runs in our namespaces), segments by the creator's pid in their name (dshim-<pid>-<hash>).

The schedule: a seeded shuffle of all kinds, then seeded random kinds until --duration seconds have
passed (or exactly --runs runs).  Prints the seed first and a replay command; ends with
`soak: N runs, M passed, K failed (seed S)` and the timing table.  Exit 0 when all passed.
"""
import argparse
import os
import random
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "common"))
from ports import free_port  # noqa: E402

TIMEOUT_S = 5.0          # DSHIM_TIMEOUT given to every job
END_SLACK_S = 2.0        # every process gone within TIMEOUT_S + END_SLACK_S of the fault
LAUNCHER_GRACE_S = 5.0   # DSHIM_RUN_KILL_GRACE's default: the controller's wait for an unreachable agent
COLLECT_WAIT_S = 1.5        # the controller's wait for dumps before it stops a failed job (launcher/collect.h)
# After a torch rank has reported a stall (its RuntimeError), Python and torch tear the interpreter down
# (the final GC, torch's operator tables: ~1 CPU-second per process, measured with perf). When every
# surviving rank fails at once (rank 0 stopped), nothing cuts that short: the first exit, and with it
# dshim-run's stop, waits for it, 2-4 s on a 2-core machine running other tests. dshim's own part is
# held to TIMEOUT_S + END_SLACK_S through the time of the first rank's report instead.
PY_TEARDOWN_S = 4.0
READY_WAIT_S = 90.0      # start-up under load (2 cores, a test run beside us)
# a torch rank's report of a failed collective (python/dshim/_comm.py's RuntimeError)
REPORT_LINE = re.compile(r"dshim: rank \d+ \(group [^)]*\): \S+ #\d+ failed")
ALL_KINDS = ["torch-none", "mx-none", "torch-kill", "mx-kill", "torch-stop",
             "torch-garbage", "mx-garbage", "torch-netcut"]
ROOT_KINDS = {"torch-netcut"}
# run's torch/MXNet jobs must never see the caller's job settings
DROP_ENV = ("DMLC_", "PS_", "DSHIM_", "MXNET_", "MASTER_", "TORCHELASTIC_")
DROP_KEYS = {"LD_PRELOAD", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}


def log(msg):
    print(msg, flush=True)


def _die_with_parent():
    """In the child before exec: SIGTERM when the soak dies (ctest's timeout kills it outright);
    dshim-run then stops its job as on Ctrl-C."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


# ------------------------------------------------------------------ processes and segments
def marker_pids(marker):
    """Live, non-zombie pids whose environment holds the marker."""
    needle = ("DSHIM_SOAK_MARKER=" + marker).encode()
    out = set()
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                if needle not in f.read():
                    continue
            with open("/proc/%s/stat" % d) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state not in ("Z", "X"):
                out.add(int(d))
        except OSError:
            pass
    return out


def ns_pids(namespaces, keep):
    """dshim-run agents inside our namespaces (a remote agent's environment is sshd's, without the
    marker; the ranks it starts carry it).  sshd's own session processes are not the job's: one whose
    client vanished behind a cut link lives until the link is back."""
    out = set()
    for ns in namespaces:
        r = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
        for w in r.stdout.split():
            p = int(w)
            if p in keep:
                continue
            try:
                with open("/proc/%d/stat" % p) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        continue
                with open("/proc/%d/cmdline" % p, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"dshim-run") and len(argv) > 1 and argv[1].startswith(b"--agent"):
                out.add(p)
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


SEG_RE = re.compile(r"^dshim-(\d+)-[0-9a-f]{16}$")


def segments_of(pids):
    out = set()
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return out
    for n in names:
        m = SEG_RE.match(n)
        if m and int(m.group(1)) in pids:
            out.add(n)
    return out


def listening_ports(pids):
    """(ip, port) of every TCP socket in LISTEN state that one of pids holds."""
    found = set()
    for pid in pids:
        inodes = set()
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                try:
                    t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                except OSError:
                    continue
                if t.startswith("socket:["):
                    inodes.add(t[8:-1])
        except OSError:
            continue
        for table, v6 in (("tcp", False), ("tcp6", True)):
            try:
                with open("/proc/%d/net/%s" % (pid, table)) as f:
                    lines = f.read().splitlines()[1:]
            except OSError:
                continue
            for ln in lines:
                w = ln.split()
                if len(w) < 10 or w[3] != "0A" or w[9] not in inodes:
                    continue
                addr_hex, port_hex = w[1].split(":")
                port = int(port_hex, 16)
                if v6:
                    ip = "::1"
                else:
                    a = bytes.fromhex(addr_hex)[::-1]
                    ip = socket.inet_ntoa(a)
                    if ip == "0.0.0.0":
                        ip = "127.0.0.1"
                found.add((ip, port))
    return sorted(found)


# ------------------------------------------------------------------ garbage
def garbage_payloads(rng):
    tok = b"not-the-job-token-%d" % rng.randrange(1 << 30)
    ps_hdr = struct.pack("<IBBHiIQQQ", 0x53505344, 7, 0, 0, 0, 0, 0, len(tok), 0)
    ps_hello = struct.pack("<IBBHiIQQQ", 0x53505344, 1, 0, 0, 0, 0, 0, 64, 0) + bytes(48) + tok[:16]
    return [
        ("random bytes", bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 3000)))),
        ("store hello, wrong token", struct.pack("<IHHI", 0x564B5344, 1, 0, len(tok)) + tok),
        ("store hello, 4 GiB token length", struct.pack("<IHHI", 0x564B5344, 1, 0, 0xFFFFFFFF) + b"x" * 64),
        ("data hello, wrong token hash", struct.pack("<IIQii", 0x43485344, 1, rng.getrandbits(64), 1, 4)),
        ("ps whello, wrong token", ps_hdr + tok),
        ("ps hello, wrong token", ps_hello),
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("connect-and-close", b""),
    ]


def attack(ip, port, payload):
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect((ip, port))
            if payload:
                s.sendall(payload)
                try:
                    s.recv(4096)
                except OSError:
                    pass
        except OSError:
            pass


# ------------------------------------------------------------------ namespace hosts
class Cluster:
    """Two namespace hosts kept up by a bash that sourced hosts.sh; it tears them down when its
    stdin closes (or when it is killed: the sshds have a parent-death signal)."""

    def __init__(self):
        script = ('source "%s"; trap hosts_down EXIT; trap "exit 143" TERM INT; hosts_up 2 || exit 1; '
                  'echo "IPS=$HOSTS_IPS"; echo "NS=$HOSTS_NS"; echo "SSH=$HOSTS_SSH"; echo "DIR=$HOSTS_DIR"; '
                  'echo UP; read -r _' % (ROOT / "tests" / "launcher" / "lib" / "hosts.sh"))
        self.p = subprocess.Popen(["bash", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        self.info = {}
        lines = []
        for line in self.p.stdout:
            lines.append(line)
            if line.strip() == "UP":
                break
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                self.info[k] = v
        if "NS" not in self.info:
            self.close()
            raise RuntimeError("hosts_up failed: " + "".join(lines[-5:]))
        self.ips = self.info["IPS"].split()
        self.ns = self.info["NS"].split()
        self.sshd = set()
        for i in range(2):
            try:
                self.sshd.add(int(Path(self.info["DIR"], "h%d.pid" % i).read_text()))
            except (OSError, ValueError):
                pass
        # also by argv: the listeners run -f DIR/hN.sshd_config
        for ns in self.ns:
            r = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, text=True)
            for w in r.stdout.split():
                if "sshd_config" in cmdline(int(w)) and "[listener]" in cmdline(int(w)) or \
                        (self.info["DIR"] + "/") in cmdline(int(w)):
                    self.sshd.add(int(w))
        self.hostfile = Path(self.info["DIR"]) / "soak_hosts"
        self.hostfile.write_text("".join(ip + "\n" for ip in self.ips))

    def link(self, i, up):
        subprocess.run(["ip", "-n", self.ns[i], "link", "set", "eth0", "up" if up else "down"], check=True)

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
            except OSError:
                pass
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


# ------------------------------------------------------------------ one run
class Run:
    def __init__(self, soak, idx, kind, rng):
        self.soak, self.idx, self.kind, self.rng = soak, idx, kind, rng
        self.job, self.fault = kind.split("-", 1)
        self.marker = str(uuid.uuid4())
        self.out = Path(tempfile.mkdtemp(prefix="soak-run%d-" % idx, dir=soak.work))
        self.lines = []          # (t, line)
        self.seen = set()
        self.last_seen = {}      # pid -> last time the watcher saw it alive
        self.argv0 = {}          # pid -> its command line when first seen
        self.segs = set()
        self.problems = []
        self.notes = []
        self.t_procs_end = None
        self.t_fault = None
        self.t_detect = None
        self.t_end = None
        self.culprit = ""
        self.cluster = soak.cluster if self.job == "torch" and self.fault == "netcut" else None

    # -- launching
    def command(self):
        b = self.soak.build
        steps = 100000 if self.fault in ("kill", "stop", "netcut") else (300 if self.fault == "garbage" else 60)
        if self.job == "torch":
            if self.cluster:
                self.nranks = 4
                pre = ["ip", "netns", "exec", self.cluster.ns[0]]
                return pre + [str(b / "bin" / "dshim-run"), "-H", str(self.cluster.hostfile), "--nnodes", "2",
                              "--nproc-per-node", "2", str(HERE / "torch_job.py"), str(self.out),
                              "--steps", str(steps)]
            self.nranks = self.rng.choice([3, 4])
            return [str(b / "bin" / "dshim-run"), "--master-port", str(free_port()), "--nproc-per-node",
                    str(self.nranks), str(HERE / "torch_job.py"), str(self.out), "--steps", str(steps)]
        self.nranks = 2
        return [str(b / "bin" / "dshim-run"), "--master-port", str(free_port()), "-n", "2", "-s", "2",
                str(self.soak.mxpy), str(HERE / "mx_job.py"), str(self.out),
                "--steps", str(steps if steps != 60 else 40)]

    def env(self):
        e = {k: v for k, v in os.environ.items() if not k.startswith(DROP_ENV) and k not in DROP_KEYS}
        e.update({"DSHIM_SOAK_MARKER": self.marker, "DSHIM_TIMEOUT": "%g" % TIMEOUT_S,
                  "DSHIM_STALL_WARN": "2", "OMP_NUM_THREADS": "1", "DSHIM_PS_COUNTERS": "1",
                  "DSHIM_RUN_PYTHON": str(self.soak.torchpy), "PYTHONUNBUFFERED": "1"})
        if self.cluster:
            e["DSHIM_RUN_SSH"] = "ssh -F " + self.cluster.info["SSH"].split("-F ", 1)[1]
        return e

    def ready_files(self):
        if self.job == "torch":
            return [self.out / ("ready_rank%d" % r) for r in range(self.nranks)]
        return [self.out / ("ready_worker%d" % r) for r in range(2)]

    def _reader(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            if self.t_fault is not None and self.t_detect is None and "dshim-run:" in line and \
                    "stopping the job" in line:
                self.t_detect = time.monotonic()

    def _watch(self):
        while not self.stop_watch.is_set():
            pids = self.job_pids()
            now = time.monotonic()
            for p in pids:
                c = cmdline(p)   # the latest: `ip netns exec` becomes dshim-run (a zombie's is empty)
                if c.strip() and c != "?":
                    self.argv0[p] = c
                self.last_seen[p] = now
            self.seen |= pids
            self.segs |= segments_of(self.seen)
            time.sleep(0.1)

    def job_pids(self):
        pids = marker_pids(self.marker)
        if self.cluster:
            pids |= ns_pids(self.cluster.ns, self.cluster.sshd | {os.getpid()})
        return pids

    # -- the run
    def go(self):
        t_start = time.monotonic()
        cmd = self.command()
        self.proc = subprocess.Popen(cmd, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace", start_new_session=True, cwd=str(self.out),
                                     preexec_fn=_die_with_parent)
        self.stop_watch = threading.Event()
        rd = threading.Thread(target=self._reader, daemon=True)
        wt = threading.Thread(target=self._watch, daemon=True)
        rd.start()
        wt.start()
        try:
            self._drive()
        finally:
            self._finish(rd, wt)
        self.secs = time.monotonic() - t_start

    def _drive(self):
        deadline = time.monotonic() + READY_WAIT_S
        while not all(f.exists() for f in self.ready_files()):
            if self.proc.poll() is not None:
                self.problems.append("job ended (exit %s) before every worker did a step" % self.proc.returncode)
                return
            if time.monotonic() > deadline:
                self.problems.append("no first step on every worker within %d s" % READY_WAIT_S)
                return
            time.sleep(0.05)
        time.sleep(self.rng.uniform(0.1, 1.0))
        if self.fault == "none":
            self._wait_exit(120)
            return
        if self.fault == "garbage":
            self._garbage()
            self._wait_exit(120)
            return
        victim_desc = self._inject()
        if victim_desc is None:
            return
        self.culprit = victim_desc
        # bounded wait well past the limits, so that the figures show how late a late end is
        hard = self.t_fault + TIMEOUT_S + LAUNCHER_GRACE_S + 30
        while time.monotonic() < hard:
            if self.proc.poll() is not None and not self.job_pids():
                self.t_end = time.monotonic()
                break
            time.sleep(0.05)
        if self.t_end is None:
            left = self.job_pids()
            self.problems.append("processes of the job still alive %.0f s after the fault: %s" % (
                time.monotonic() - self.t_fault, "; ".join("%d %s" % (p, cmdline(p)) for p in sorted(left))))
            return
        # the job's own processes (ranks, workers, servers, scheduler): not dshim-run
        ends = [t for p, t in self.last_seen.items() if not self.is_launcher(p)]
        self.t_procs_end = max(max(ends) + 0.05, self.t_fault) if ends else self.t_fault
        limit = TIMEOUT_S + END_SLACK_S
        if self.job == "torch" and self.fault in ("stop", "netcut"):
            reported = [t for t, l in self.lines if REPORT_LINE.search(l)]
            if not reported:
                self.problems.append("no rank reported the stall (a 'dshim: rank R ... failed' error)")
            elif reported[0] - self.t_fault > limit:
                self.problems.append("the first rank reported the stall %.2f s after the fault, over %g s" % (
                    reported[0] - self.t_fault, limit))
            limit += PY_TEARDOWN_S
        if self.t_procs_end - self.t_fault > limit:
            self.problems.append("the job's processes ended %.2f s after the fault, over %g s" % (
                self.t_procs_end - self.t_fault, limit))
        # dshim-run (controller and agents): as fast, except across a cut link, where the controller
        # first waits for the far agent's flight-recorder dumps (RUN_COLLECT_WAIT_S, launcher/collect.h),
        # then gives it DSHIM_RUN_KILL_GRACE + 2 s (docs/launcher.md)
        llimit = limit + (COLLECT_WAIT_S + LAUNCHER_GRACE_S + 2.0 if self.fault == "netcut" else 0.0)
        if self.t_end - self.t_fault > llimit:
            self.problems.append("dshim-run ended %.2f s after the fault, over %g s" % (
                self.t_end - self.t_fault, llimit))

    def is_launcher(self, pid):
        """dshim-run (controller, agents) and the controller's ssh clients."""
        argv0 = os.path.basename(self.argv0.get(pid, "").split(" ")[0])
        return argv0 in ("dshim-run", "ssh")

    def _wait_exit(self, secs):
        try:
            self.proc.wait(secs)
        except subprocess.TimeoutExpired:
            self.problems.append("job did not end within %d s" % secs)

    def _pid_of_role(self, role, index):
        for p in sorted(self.job_pids()):
            try:
                env = Path("/proc/%d/environ" % p).read_bytes().split(b"\0")
            except OSError:
                continue
            d = dict(x.split(b"=", 1) for x in env if b"=" in x)
            if d.get(b"DMLC_ROLE") == role.encode() and b"dshim-run" not in Path(
                    "/proc/%d/cmdline" % p).read_bytes().split(b"\0")[0]:
                if role == "scheduler" or int(d.get(b"DMLC_TASK_ID", b"-1")) == index + (2 if role == "worker" else 0):
                    return p
        return None

    def _inject(self):
        rng = self.rng
        if self.fault == "netcut":
            self.victim = 1
            self.t_fault = time.monotonic()
            self.cluster.link(1, False)
            self.cut = True
            return "host %s (ranks 2, 3) cut off" % self.cluster.ips[1]
        if self.job == "torch":
            r = rng.randrange(self.nranks)
            pid = int((self.out / ("ready_rank%d" % r)).read_text())
            role, idx = "rank", r
        else:
            role = rng.choice(["worker", "server", "scheduler"])
            idx = rng.randrange(2) if role != "scheduler" else 0
            pid = int((self.out / ("ready_worker%d" % idx)).read_text()) if role == "worker" else \
                self._pid_of_role(role, idx)
            if pid is None:
                self.problems.append("could not find the pid of %s %d" % (role, idx))
                return None
        self.victim = (role, idx, pid)
        sig = signal.SIGKILL if self.fault == "kill" else signal.SIGSTOP
        self.t_fault = time.monotonic()
        os.kill(pid, sig)
        name = role if role == "scheduler" else "%s %d" % (role, idx)
        return "%s (pid %d) %s" % (name, pid, "SIGKILL" if sig == signal.SIGKILL else "SIGSTOP")

    def _garbage(self):
        ports = listening_ports(self.job_pids())
        if not ports:
            self.problems.append("found no listening port of the job")
            return
        n = 0
        for ip, port in ports:
            for _, payload in garbage_payloads(self.rng):
                attack(ip, port, payload)
                n += 1
        self.culprit = "%d connections to %d ports (%s)" % (n, len(ports), " ".join(str(p) for _, p in ports))

    def _finish(self, rd, wt):
        # the launcher must be gone; if not, that is a failure, and we end it
        if self.proc.poll() is None:
            try:
                self.proc.wait(30 if self.t_fault else 1)
            except subprocess.TimeoutExpired:
                self.problems.append("dshim-run still running at the end of the run")
        if self.cluster and getattr(self, "cut", False):
            self.cluster.link(1, True)
        rd.join(5)
        self.stop_watch.set()
        wt.join(5)
        left = self.job_pids()
        if left:
            self.problems.append("left running: " + "; ".join("%d %s" % (p, cmdline(p)) for p in sorted(left)))
        segs = {s for s in self.segs if os.path.exists("/dev/shm/" + s)} | segments_of(self.seen)
        if segs:
            self.problems.append("/dev/shm segments left: " + " ".join(sorted(segs)))
        self.cleanup(left, segs)
        self.check_output()

    def cleanup(self, left, segs):
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        for s in segs:
            try:
                os.unlink("/dev/shm/" + s)
            except OSError:
                pass

    def text(self):
        return "\n".join(l for _, l in self.lines)

    def check_output(self):
        rc = self.proc.returncode
        text = self.text()
        if self.fault in ("none", "garbage"):
            if rc != 0:
                self.problems.append("exit code %s, want 0" % rc)
            if self.job == "torch":
                for r in range(self.nranks):
                    f = self.out / ("ok_rank%d" % r)
                    if not f.exists():
                        self.problems.append("rank %d did not finish its checked steps" % r)
                    elif not f.read_text().startswith("Dshim"):
                        self.problems.append("rank %d's group was carried by %s, not dshim" % (r, f.read_text()))
            else:
                for r in range(2):
                    if not (self.out / ("ok_worker%d" % r)).exists():
                        self.problems.append("worker %d did not finish its checked steps" % r)
                if "[dshim-ps server 0] carried" not in text:
                    self.problems.append("dshim's parameter server did not report carrying the job")
            if "WRONG" in text:
                self.problems.append("a wrong result was reported")
            if self.fault == "garbage":
                rej = [l for l in text.splitlines() if re.search(r"reject|refus|bad job token|wrong job token|"
                                                                 r"not a dshim|garbage|stranger", l, re.I)]
                self.rejections = len(rej)
                if not rej:
                    self.problems.append("no rejection was logged for the garbage connections")
            return
        if rc in (0, None):
            self.problems.append("exit code %s, want non-zero" % rc)
        if self.t_fault is None:
            return
        lines = [l for _, l in self.lines]
        if self.fault == "kill":
            role, idx, pid = self.victim
            name = role if role == "scheduler" else "%s %d" % (role, idx)
            hit = [l for l in lines if l.startswith("dshim-run:") and name in l and "pid %d" % pid in l
                   and re.search(r"SIGKILL|signal 9|killed", l)]
            if not hit:
                self.problems.append("no launcher line names %s (pid %d) and SIGKILL" % (name, pid))
        elif self.fault == "stop":
            _, idx, pid = self.victim
            pat = re.compile(r"(did not arrive|not arrived|have not arrived|no progress|timed? ?out)", re.I)
            hit = [l for l in lines if pat.search(l) and re.search(r"\b(rank|ranks)\b[^.;]*\b%d\b" % idx, l)]
            if not hit:
                self.problems.append("no timeout/stall message names rank %d" % idx)
            if self.t_detect is None:
                self.problems.append("the launcher printed no failure line")
        elif self.fault == "netcut":
            ip1 = self.cluster.ips[1]
            pat = re.compile(r"(did not arrive|not arrived|no progress|timed? ?out|unreachable|lost|closed)", re.I)
            hit = [l for l in lines if pat.search(l) and (re.search(r"\branks? [^.;]*\b[23]\b", l) or ip1 in l)]
            if not hit:
                self.problems.append("no message names the cut-off host %s or its ranks 2, 3" % ip1)

    def report(self):
        ok = not self.problems
        fig = ""
        if self.t_fault is not None:
            det = "%.2f" % (self.t_detect - self.t_fault) if self.t_detect else "-"
            end = "%.2f" % (self.t_end - self.t_fault) if self.t_end else "-"
            pend = "%.2f" % (self.t_procs_end - self.t_fault) if self.t_procs_end else "-"
            fig = "; failure line %s s, job's processes gone %s s, dshim-run gone %s s" % (det, pend, end)
        rej = " rejections logged: %d" % self.rejections if hasattr(self, "rejections") else ""
        log("soak run %d %-13s %s: %s%s%s (%.1f s; exit %s)%s" % (
            self.idx, self.kind, "PASS" if ok else "FAIL", self.culprit or ("%d ranks" % self.nranks
                                                                              if self.job == "torch" else "2w 2s"),
            fig, "", self.secs, self.proc.returncode, rej))
        fl = [l for _, l in self.lines if l.startswith("dshim-run:") and ("stopping" in l or "failed" in l)]
        for l in fl[:2]:
            log("    " + l[:300])
        for n in self.notes:
            log("    " + n)
        if not ok:
            for p in self.problems:
                log("    PROBLEM: " + p)
            t0 = self.t_fault
            log("    output (last 40 lines%s):" % (", seconds after the fault" if t0 else ""))
            for t, l in self.lines[-40:]:
                log("      | %s%s" % ("%+7.2f " % (t - t0) if t0 else "", l[:300]))
            if t0 and self.last_seen:
                log("    the job's processes, last seen alive (s after the fault):")
                for p, t in sorted(self.last_seen.items(), key=lambda x: x[1])[-6:]:
                    log("      %+7.2f pid %d %s" % (t - t0, p, self.argv0.get(p, "?")[:100]))
        return ok


class Soak:
    def __init__(self, a):
        self.build = Path(a.build_dir or os.environ.get("DSHIM_BUILD_DIR") or ROOT / "build").resolve()
        self.torchpy = ROOT / ".venv" / "bin" / "python"
        self.mxpy = ROOT / ".venv-mxnet" / "bin" / "python"
        self.work = None      # made once the checks passed
        self.cluster = None


def root_ok():
    if os.geteuid() != 0:
        return "not root"
    for prog in ("ip", "sshd", "ssh", "ssh-keygen", "setpriv"):
        if not shutil.which(prog) and not os.path.exists("/usr/sbin/" + prog):
            return "%s not found" % prog
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--runs", type=int, default=None, help="exactly this many runs")
    ap.add_argument("--duration", type=float, default=180.0, help="start runs until this many seconds passed")
    ap.add_argument("--kinds", default=",".join(ALL_KINDS), help="comma-separated subset of " + ",".join(ALL_KINDS))
    ap.add_argument("--build-dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little") % 1000000
    rng = random.Random(seed)
    replay = "python3 %s --seed %d %s" % (Path(__file__).relative_to(ROOT) if str(Path(__file__)).startswith(
        str(ROOT)) else __file__, seed, "--runs %d" % a.runs if a.runs else "--duration %g" % a.duration)
    if a.kinds != ",".join(ALL_KINDS):
        replay += " --kinds " + a.kinds
    log("soak: seed %d; replay: %s" % (seed, replay))
    soak = Soak(a)
    cache = soak.build / "CMakeCache.txt"
    if cache.exists() and re.search(r"^DSHIM_SANITIZE:STRING=\S", cache.read_text(), re.M):
        log("SKIP: %s is a sanitizer build, whose libdshim.so cannot be preloaded into python" % soak.build)
        return 77
    for f in (soak.build / "bin" / "dshim-run", soak.torchpy, soak.mxpy):
        if not os.path.exists(f):
            log("soak: %s not found (make setup; make), or set DSHIM_BUILD_DIR" % f)
            return 1
    kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in kinds if k not in ALL_KINDS]
    if bad:
        log("soak: unknown kind(s) %s" % bad)
        return 2
    why = root_ok()
    skipped = [k for k in kinds if k in ROOT_KINDS] if why else []
    if skipped:
        log("soak: SKIP %s (%s: network namespaces need root)" % (",".join(skipped), why))
        kinds = [k for k in kinds if k not in ROOT_KINDS]
        if not kinds:
            log("soak: SKIP: every kind asked for needs root")
            return 77
    soak.work = Path(tempfile.mkdtemp(prefix="dshim-soak-"))
    order = kinds[:]
    rng.shuffle(order)
    t0 = time.monotonic()
    results = []
    try:
        i = 0
        while True:
            if a.runs is not None and i >= a.runs:
                break
            if a.runs is None and time.monotonic() - t0 >= a.duration:
                break
            if time.monotonic() - t0 >= a.duration + 150:
                log("soak: stopping early: %.0f s spent (--duration %g + 150)" % (time.monotonic() - t0, a.duration))
                break
            kind = order[i] if i < len(order) else rng.choice(kinds)
            if kind == "torch-netcut" and soak.cluster is None:
                try:
                    soak.cluster = Cluster()
                except RuntimeError as e:
                    log("soak run %d torch-netcut FAIL: %s" % (i, e))
                    results.append((kind, False, None))
                    i += 1
                    continue
            run = Run(soak, i, kind, random.Random(rng.getrandbits(64)))
            run.go()
            ok = run.report()
            results.append((kind, ok, run))
            i += 1
    finally:
        if soak.cluster:
            soak.cluster.close()
    # figures
    log("soak: seconds from the fault to dshim-run's failure line, to the last of the job's processes gone, "
        "and to dshim-run's exit (min / median / max over the runs):")
    for kind in kinds:
        rs = [r for k, ok, r in results if k == kind and r is not None]
        if not rs:
            continue
        det = [r.t_detect - r.t_fault for r in rs if r.t_fault is not None and r.t_detect is not None]
        end = [r.t_end - r.t_fault for r in rs if r.t_fault is not None and r.t_end is not None]
        pend = [r.t_procs_end - r.t_fault for r in rs if r.t_fault is not None and r.t_procs_end is not None]

        def mmm(v):
            return "%.2f / %.2f / %.2f" % (min(v), statistics.median(v), max(v)) if v else "-"
        if not det and not end:
            log("  %-14s runs %2d  (no fault: results checked)" % (kind, len(rs)))
            continue
        log("  %-14s runs %2d  failure line %-20s  job's processes gone %-20s  dshim-run gone %s" % (
            kind, len(rs), mmm(det), mmm(pend), mmm(end)))
    npass = sum(1 for _, ok, _ in results if ok)
    nfail = len(results) - npass
    log("soak: %d runs, %d passed, %d failed (seed %d) in %.0f s%s" % (
        len(results), npass, nfail, seed, time.monotonic() - t0,
        "; skipped (%s): %s" % (why, ",".join(skipped)) if skipped else ""))
    if nfail:
        log("soak: replay: " + replay)
    if not a.keep and not nfail:
        shutil.rmtree(soak.work, ignore_errors=True)
    else:
        log("soak: work directory kept: %s" % soak.work)
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
