"""horovod.run(func, ...): func runs in every rank of a job started as horovodrun starts one, and
its return values come back in rank order (Horovod's run-function mode).

The driver (the caller of horovod.run) serves the cloudpickled function and collects the pickled
results over a small TCP service of its own, as Horovod's KVStoreServer does: the ranks reach it
at the address they reach dshim-run's rendezvous store at (dshim-run runs here, so that is this
host), and every request carries the job's secret (DSHIM_JOB_TOKEN, which dshim-run hands to every
rank), compared in constant time.  Each rank runs `python -m horovod.runner.run_task PORT`.
"""
import hmac
import secrets
import socket
import socketserver
import struct
import sys
import threading

MAGIC = b'HVDRUN1'
_LEN = struct.Struct('!Q')
MAX_REQUEST_LINE = 256


def _read_exact(f, n):
    data = f.read(n)
    if data is None or len(data) != n:
        raise ConnectionError('connection closed in the middle of a message')
    return data


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class FuncServer:
    """Serves one payload (GET) and takes one result per rank (PUT <rank>)."""

    def __init__(self, payload, token, bind_all):
        self.payload = payload
        self.token = token.encode()
        self.results = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                try:
                    outer._handle(self.rfile, self.wfile)
                except (ConnectionError, ValueError, OSError):
                    pass   # a stranger or a rank that died: nothing is stored

        self.server = _Server(('' if bind_all else '127.0.0.1', 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name='horovod.run server', daemon=True)

    def _handle(self, rfile, wfile):
        line = rfile.readline(MAX_REQUEST_LINE)
        words = line.split()
        if len(words) < 3 or words[0] != MAGIC or not hmac.compare_digest(words[1], self.token):
            return
        if words[2] == b'GET' and len(words) == 3:
            wfile.write(_LEN.pack(len(self.payload)) + self.payload)
        elif words[2] == b'PUT' and len(words) == 4 and words[3].isdigit():
            size = _LEN.unpack(_read_exact(rfile, _LEN.size))[0]
            data = _read_exact(rfile, size)
            with self.lock:
                self.results[int(words[3])] = data
            wfile.write(b'OK\n')

    def start(self):
        self.thread.start()
        return self.server.server_address[1]

    def shutdown(self):
        self.server.shutdown()
        self.server.server_close()


def _request(addr, port, token, words, body=None):
    with socket.create_connection((addr, port), timeout=300) as s:
        f = s.makefile('rwb')
        f.write(b' '.join([MAGIC, token.encode()] + words) + b'\n')
        if body is not None:
            f.write(_LEN.pack(len(body)) + body)
        f.flush()
        if body is None:
            return _read_exact(f, _LEN.unpack(_read_exact(f, _LEN.size))[0])
        if f.readline(16) != b'OK\n':
            raise ConnectionError(f'horovod.run: the driver at {addr}:{port} did not take the result')
        return None


def fetch_func(addr, port, token):
    return _request(addr, port, token, [b'GET'])


def put_result(addr, port, token, rank, data):
    _request(addr, port, token, [b'PUT', str(rank).encode()], data)


def _all_local(placement):
    """Whether every host of the job is this machine (then the service listens on loopback only)."""
    here = {'localhost', socket.gethostname(), socket.getfqdn()}
    for host, _ in placement:
        if host in here:
            continue
        try:
            if not socket.gethostbyname(host).startswith('127.'):
                return False
        except OSError:
            return False
    return True


def run(args, launch):
    """Runs args.run_func in every rank (launch: horovod.runner.launch.launch); the results."""
    import os
    import cloudpickle
    from horovod.runner.launch import assign
    token = secrets.token_hex(16)
    server = FuncServer(cloudpickle.dumps(args.run_func), token, bind_all=not _all_local(assign(args)))
    port = server.start()
    try:
        executable = args.executable or sys.executable
        env = dict(os.environ, DSHIM_JOB_TOKEN=token)
        rc = launch(args, [executable, '-m', 'horovod.runner.run_task', str(port)], env)
        if rc != 0:
            raise RuntimeError('Horovod detected that one or more processes exited with non-zero status, thus '
                               f'causing the job to be terminated (dshim-run exit code {rc}; its output above '
                               f'names the rank)')
        with server.lock:
            missing = [r for r in range(args.num_proc) if r not in server.results]
            if missing:
                raise RuntimeError(f'horovod.run: ranks {missing} exited without returning a result')
            return [cloudpickle.loads(server.results[r]) for r in range(args.num_proc)]
    finally:
        server.shutdown()
