"""horovodrun on dshim: Horovod 0.28.1's command line, run by dshim-run.

    horovodrun -np 4 -H host1:2,host2:2 python train.py

Horovod's flags are read as Horovod reads them; the job is then one `dshim-run --horovod-env`
invocation (docs/horovod.md, docs/launcher.md):
- the ranks are placed as Horovod places them (common/util/hosts.py get_host_assignments: hosts
  filled in order), and dshim-run gets a hostfile with each host's share as `slots=N`;
- dshim-run gives every rank HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*/HOSTNAME, HOROVOD_CONTROLLER=gloo
  and HOROVOD_CPU_OPERATIONS=gloo as Horovod's gloo launcher does, and dshim's own rendezvous;
- the tuning and logging flags become the HOROVOD_* variables Horovod's launcher sets
  (config_parser.set_env_from_args), read by dshim's Horovod layer in the ranks;
- the command runs as given (dshim-run --no-python), with this environment.
Errors in the command line are one line and exit code 2, as dshim-run's.  Elastic mode
(--min-np, --max-np, --host-discovery-script) is refused: dshim-run runs jobs of a fixed size.
"""
import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap

import horovod
from horovod.common.util import ccl_built, ddl_built, extension_available, gloo_built, mpi_built, nccl_built
from horovod.runner.common.util import env as env_util
from horovod.runner.common.util import hosts as hosts_util

LOG_LEVELS = ['TRACE', 'DEBUG', 'INFO', 'WARNING', 'ERROR', 'FATAL']
USAGE_EXIT = 2


class UsageError(Exception):
    """A command-line problem: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _store_override(override_args):
    """Horovod's override actions: the value, and the option's name remembered as given."""
    class StoreOverride(argparse.Action):
        def __call__(self, parser, args, values, option_string=None):
            override_args.add(self.dest)
            setattr(args, self.dest, values)
    return StoreOverride


def _store_bool(override_args, value):
    class StoreBool(argparse.Action):
        def __init__(self, option_strings, dest, required=False, help=None):
            super().__init__(option_strings=option_strings, dest=dest, nargs=0, const=value, default=None,
                             required=required, help=help)

        def __call__(self, parser, args, values, option_string=None):
            override_args.add(self.dest)
            setattr(args, self.dest, self.const)
    return StoreBool


class _Nics(argparse.Action):
    """--network-interface(s): repeatable, comma-separated; order kept (the first is Gloo's)."""
    def __call__(self, parser, args, values, option_string=None):
        items = list(getattr(args, self.dest, None) or [])
        for nic in values.split(','):
            if nic and nic not in items:
                items.append(nic)
        setattr(args, self.dest, items)


def make_parser():
    override_args = set()
    o = _store_override(override_args)
    true, false = _store_bool(override_args, True), _store_bool(override_args, False)
    p = _Parser(prog='horovodrun', description="Horovod Runner (dshim: the job runs under dshim-run)",
                allow_abbrev=False)
    p.add_argument('-v', '--version', action='version', version=getattr(horovod, '__version__', '0.28.1'),
                   help='Shows Horovod version.')
    p.add_argument('-np', '--num-proc', dest='num_proc', type=int, help='Total number of training processes.')
    p.add_argument('-cb', '--check-build', dest='check_build', action='store_true',
                   help='Shows which frameworks and libraries dshim\'s Horovod layer provides.')
    p.add_argument('--disable-cache', action='store_true', dest='disable_cache',
                   help='Accepted; dshim-run checks the hosts on every start (there is no cache).')
    p.add_argument('--start-timeout', dest='start_timeout', type=int,
                   help='Seconds for the ranks to reach the rendezvous and each other (DSHIM_CONNECT_TIMEOUT).')
    p.add_argument('--network-interfaces', '--network-interface', dest='nics', action=_Nics,
                   help='Interfaces for the ranks\' connections, comma-separated or repeated.')
    p.add_argument('--output-filename', dest='output_filename',
                   help='Also write each rank\'s output to <DIR>/rank<N>.log (dshim-run --log-dir).')
    p.add_argument('--verbose', action='store_true', dest='verbose',
                   help='Print the dshim-run command line before running it.')
    p.add_argument('--config-file', dest='config_file', help='Refused: give the options on the command line.')
    p.add_argument('command', nargs=argparse.REMAINDER, help='Command to be executed.')

    g = p.add_argument_group('SSH arguments')
    g.add_argument('-p', '--ssh-port', dest='ssh_port', type=int, help='SSH port on all the hosts.')
    g.add_argument('-i', '--ssh-identity-file', dest='ssh_identity_file',
                   help='Identity (private key) file for ssh.')

    g = p.add_argument_group('tuneable parameter arguments')
    g.add_argument('--fusion-threshold-mb', action=o, type=int, dest='fusion_threshold_mb',
                   help='HOROVOD_FUSION_THRESHOLD in MiB.')
    g.add_argument('--cycle-time-ms', action=o, type=float, dest='cycle_time_ms', help='HOROVOD_CYCLE_TIME.')
    g.add_argument('--cache-capacity', action=o, type=int, dest='cache_capacity', help='HOROVOD_CACHE_CAPACITY.')
    for name in ('hierarchical-allreduce', 'hierarchical-allgather', 'torus-allreduce'):
        dest = name.replace('-', '_')
        x = g.add_mutually_exclusive_group()
        x.add_argument(f'--{name}', action=true, dest=dest, help=f'HOROVOD_{dest.upper()}=1.')
        x.add_argument(f'--no-{name}', action=false, dest=dest, help=f'HOROVOD_{dest.upper()}=0.')

    g = p.add_argument_group('autotune arguments')
    x = g.add_mutually_exclusive_group()
    x.add_argument('--autotune', action=true, dest='autotune', help='HOROVOD_AUTOTUNE=1.')
    x.add_argument('--no-autotune', action=false, dest='autotune', help=argparse.SUPPRESS)
    g.add_argument('--autotune-log-file', action=o, dest='autotune_log_file')
    g.add_argument('--autotune-warmup-samples', action=o, type=int, dest='autotune_warmup_samples')
    g.add_argument('--autotune-steps-per-sample', action=o, type=int, dest='autotune_steps_per_sample')
    g.add_argument('--autotune-bayes-opt-max-samples', action=o, type=int, dest='autotune_bayes_opt_max_samples')
    g.add_argument('--autotune-gaussian-process-noise', action=o, type=float,
                   dest='autotune_gaussian_process_noise')

    g = p.add_argument_group('elastic arguments (refused: dshim-run runs jobs of a fixed size)')
    g.add_argument('--min-np', '--min-num-proc', dest='min_num_proc', type=int)
    g.add_argument('--max-np', '--max-num-proc', dest='max_num_proc', type=int)
    g.add_argument('--slots-per-host', dest='slots', type=int)
    g.add_argument('--elastic-timeout', dest='elastic_timeout', type=int)
    g.add_argument('--reset-limit', dest='reset_limit', type=int)
    g.add_argument('--blacklist-cooldown-range', dest='cooldown_range', type=int, nargs=2)

    g = p.add_argument_group('timeline arguments')
    g.add_argument('--timeline-filename', action=o, dest='timeline_filename',
                   help='HOROVOD_TIMELINE: Horovod\'s timeline, written by rank 0.')
    x = g.add_mutually_exclusive_group()
    x.add_argument('--timeline-mark-cycles', action=true, dest='timeline_mark_cycles')
    x.add_argument('--no-timeline-mark-cycles', action=false, dest='timeline_mark_cycles', help=argparse.SUPPRESS)

    g = p.add_argument_group('stall check arguments')
    x = g.add_mutually_exclusive_group()
    x.add_argument('--no-stall-check', action=true, dest='no_stall_check')
    x.add_argument('--stall-check', action=false, dest='no_stall_check', help=argparse.SUPPRESS)
    g.add_argument('--stall-check-warning-time-seconds', action=o, type=int, dest='stall_check_warning_time_seconds')
    g.add_argument('--stall-check-shutdown-time-seconds', action=o, type=int,
                   dest='stall_check_shutdown_time_seconds')

    g = p.add_argument_group('library arguments')
    x = g.add_mutually_exclusive_group()
    x.add_argument('--mpi-threads-disable', action=true, dest='mpi_threads_disable')
    x.add_argument('--no-mpi-threads-disable', action=false, dest='mpi_threads_disable', help=argparse.SUPPRESS)
    g.add_argument('--mpi-args', dest='mpi_args', help='Refused: there is no mpirun.')
    g.add_argument('--tcp', action='store_true', dest='tcp_flag', help='NCCL_IB_DISABLE=1.')
    g.add_argument('--binding-args', dest='binding_args', help='Refused: there is no mpirun.')
    g.add_argument('--num-nccl-streams', action=o, type=int, dest='num_nccl_streams')
    g.add_argument('--thread-affinity', action=o, type=int, dest='thread_affinity')
    g.add_argument('--gloo-timeout-seconds', action=o, type=int, dest='gloo_timeout_seconds')

    g = p.add_argument_group('logging arguments')
    g.add_argument('--log-level', action=o, choices=LOG_LEVELS, dest='log_level')
    x = g.add_mutually_exclusive_group()
    x.add_argument('--log-with-timestamp', action=true, dest='log_with_timestamp', help=argparse.SUPPRESS)
    x.add_argument('--log-without-timestamp', '--log-hide-timestamp', action=false, dest='log_with_timestamp')
    x.add_argument('-prefix-timestamp', '--prefix-output-with-timestamp', action='store_true',
                   dest='prefix_output_with_timestamp', help='Accepted; dshim-run prefixes lines with the rank.')

    g = p.add_argument_group('host arguments').add_mutually_exclusive_group()
    g.add_argument('-H', '--hosts', dest='hosts', help='host1:slots,host2:slots,... (default localhost:<np>).')
    g.add_argument('-hostfile', '--hostfile', dest='hostfile', help='A file of "<hostname> slots=<N>" lines.')
    g.add_argument('--host-discovery-script', action=o, dest='host_discovery_script')

    g = p.add_argument_group('controller arguments').add_mutually_exclusive_group()
    g.add_argument('--gloo', action='store_true', dest='use_gloo', help='Accepted: dshim answers as Gloo.')
    g.add_argument('--mpi', action='store_true', dest='use_mpi', help='Accepted: dshim runs without MPI.')
    g.add_argument('--jsrun', action='store_true', dest='use_jsrun', help='Refused: there is no jsrun.')
    return p


def parse_args(argv=None):
    """Horovod's arguments; UsageError (one line) for anything this launcher cannot do."""
    args = make_parser().parse_args(argv)
    args.run_func = None
    args.executable = None
    if args.check_build:
        return args
    if args.num_proc is None:
        raise UsageError('the following arguments are required: -np/--num-proc')
    if args.config_file:
        raise UsageError('--config-file is not supported here; give the options on the command line')
    if args.use_jsrun:
        raise UsageError('--jsrun: dshim starts the ranks with dshim-run (ssh or local); drop --jsrun')
    if args.mpi_args or args.binding_args:
        raise UsageError(f"{'--mpi-args' if args.mpi_args else '--binding-args'}: dshim runs no mpirun; drop it")
    if not args.command:
        raise UsageError('no command given: horovodrun -np N [options] command [args...]')
    return args


def check_build(verbose=False):
    """Horovod's --check-build table: X where dshim's Horovod layer provides it."""
    def mark(value):
        return 'X' if value else ' '
    print(textwrap.dedent('''\
        {newline}Horovod v{version} (dshim's Horovod layer, docs/horovod.md):

        Available Frameworks:
            [{tensorflow}] TensorFlow
            [{torch}] PyTorch
            [{mxnet}] MXNet

        Available Controllers:
            [{mpi}] MPI
            [{gloo}] Gloo

        Available Tensor Operations:
            [{nccl}] NCCL
            [{ddl}] DDL
            [{ccl}] CCL
            [{mpi}] MPI
            [{gloo}] Gloo''').format(
        newline='\n' if verbose else '', version=getattr(horovod, '__version__', '0.28.1'),
        tensorflow=mark(extension_available('tensorflow', verbose=verbose)),
        torch=mark(extension_available('torch', verbose=verbose)),
        mxnet=mark(extension_available('mxnet', verbose=verbose)),
        mpi=mark(mpi_built(verbose=verbose)), gloo=mark(gloo_built(verbose=verbose)),
        nccl=mark(nccl_built(verbose=verbose)), ddl=mark(ddl_built(verbose=verbose)),
        ccl=mark(ccl_built(verbose=verbose))))


# ---- the job ------------------------------------------------------------------------------------

def _add(env, name, value, transform=str):
    if value is not None:
        env[name] = str(transform(value))


def set_env_from_args(env, args):
    """The HOROVOD_* variables Horovod's launcher derives from its flags (config_parser)."""
    def flag(v):
        return 1 if v else 0
    _add(env, 'HOROVOD_FUSION_THRESHOLD', args.fusion_threshold_mb, lambda v: v * 1024 * 1024)
    _add(env, 'HOROVOD_CYCLE_TIME', args.cycle_time_ms)
    _add(env, 'HOROVOD_CACHE_CAPACITY', args.cache_capacity)
    _add(env, 'HOROVOD_HIERARCHICAL_ALLREDUCE', args.hierarchical_allreduce, flag)
    _add(env, 'HOROVOD_HIERARCHICAL_ALLGATHER', args.hierarchical_allgather, flag)
    _add(env, 'HOROVOD_TORUS_ALLREDUCE', args.torus_allreduce, flag)
    if args.autotune:
        _add(env, 'HOROVOD_AUTOTUNE', args.autotune, flag)
        _add(env, 'HOROVOD_AUTOTUNE_LOG', args.autotune_log_file)
        _add(env, 'HOROVOD_AUTOTUNE_WARMUP_SAMPLES', args.autotune_warmup_samples)
        _add(env, 'HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE', args.autotune_steps_per_sample)
        _add(env, 'HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES', args.autotune_bayes_opt_max_samples)
        _add(env, 'HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE', args.autotune_gaussian_process_noise)
    if args.timeline_filename:
        _add(env, 'HOROVOD_TIMELINE', args.timeline_filename)
        _add(env, 'HOROVOD_TIMELINE_MARK_CYCLES', args.timeline_mark_cycles, flag)
    _add(env, 'HOROVOD_STALL_CHECK_DISABLE', args.no_stall_check, flag)
    _add(env, 'HOROVOD_STALL_CHECK_TIME_SECONDS', args.stall_check_warning_time_seconds)
    _add(env, 'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS', args.stall_check_shutdown_time_seconds)
    _add(env, 'HOROVOD_MPI_THREADS_DISABLE', args.mpi_threads_disable, flag)
    _add(env, 'HOROVOD_NUM_NCCL_STREAMS', args.num_nccl_streams)
    _add(env, 'NCCL_IB_DISABLE', 1 if args.tcp_flag else None)
    _add(env, 'HOROVOD_THREAD_AFFINITY', args.thread_affinity)
    _add(env, 'HOROVOD_GLOO_TIMEOUT_SECONDS', args.gloo_timeout_seconds)
    _add(env, 'HOROVOD_LOG_LEVEL', args.log_level)
    _add(env, 'HOROVOD_LOG_HIDE_TIME', args.log_with_timestamp, lambda v: 0 if v else 1)
    return env


def host_string(args):
    """-H, else the hostfile's hosts, else localhost:<np> (Horovod's default)."""
    if args.hosts:
        return args.hosts
    if args.hostfile:
        try:
            return hosts_util.parse_host_files(args.hostfile)
        except OSError as e:
            raise UsageError(f"cannot read hostfile '{args.hostfile}': {e.strerror}") from None
        except ValueError as e:
            raise UsageError(str(e)) from None
    return f'localhost:{args.num_proc}'


def assign(args):
    """[(host, ranks on it)] in Horovod's order, hosts without ranks left out."""
    try:
        slots = hosts_util.get_host_assignments(hosts_util.parse_hosts(host_string(args)), args.num_proc,
                                                args.num_proc)
    except ValueError as e:
        raise UsageError(str(e)) from None
    order = []
    for s in slots:
        if s.local_rank == 0:
            order.append([s.hostname, 0])
        order[-1][1] += 1
    return [tuple(h) for h in order]


def _dshim_run():
    import _dshim_commands   # beside the dshim package: the dshim-run of this installation
    return _dshim_commands._program('dshim-run')


def job_env(args, env):
    """This environment plus what Horovod's flags ask of the ranks and of dshim-run."""
    env = set_env_from_args(dict(env), args)
    if args.start_timeout is not None:
        env['DSHIM_CONNECT_TIMEOUT'] = str(args.start_timeout)
    if args.nics:
        env['DSHIM_SOCKET_IFNAME'] = ','.join(args.nics)
        env['HOROVOD_GLOO_IFACE'] = args.nics[0]
        env['NCCL_SOCKET_IFNAME'] = ','.join(args.nics)
    if args.ssh_identity_file:
        if any(c.isspace() for c in args.ssh_identity_file):
            raise UsageError(f'--ssh-identity-file {args.ssh_identity_file!r}: a path without spaces, please '
                             f'(dshim-run splits DSHIM_RUN_SSH at spaces)')
        env['DSHIM_RUN_SSH'] = f"{env_util.config('DSHIM_RUN_SSH') or 'ssh'} -i {args.ssh_identity_file}"
    return env


def dshim_run_argv(args, hostfile, command):
    argv = [_dshim_run(), '--horovod-env', '-H', hostfile, '--no-python']
    if args.output_filename:
        argv += ['--log-dir', args.output_filename]
    return argv + ['--'] + list(command)


def write_hostfile(directory, placement, ssh_port):
    path = os.path.join(directory, 'hosts')
    with open(path, 'w') as f:
        for host, count in placement:
            f.write(f"{host}{f':{ssh_port}' if ssh_port else ''} slots={count}\n")
    return path


def launch(args, command, env):
    """Runs the job under dshim-run; its exit code (128 + N for a signal N)."""
    placement = assign(args)
    env = job_env(args, env)
    with tempfile.TemporaryDirectory(prefix='horovodrun.') as tmp:
        argv = dshim_run_argv(args, write_hostfile(tmp, placement, args.ssh_port), command)
        if args.verbose:
            print('horovodrun: ' + ' '.join(shlex.quote(a) for a in argv), file=sys.stderr, flush=True)
        proc = subprocess.Popen(argv, env=env)
        # Ctrl-C reaches dshim-run from the terminal (same process group): it stops the job and
        # exits; a SIGTERM/SIGHUP sent to horovodrun alone is passed on to it
        old = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, lambda signum, frame: proc.send_signal(signum))
        try:
            rc = proc.wait()
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
    return 128 - rc if rc < 0 else rc


def _elastic(args):
    return args.host_discovery_script is not None or args.min_num_proc is not None or \
        args.max_num_proc is not None


def _run(args):
    """Horovod's entry point for horovodrun and horovod.run(): the job's exit code, or with
    args.run_func the list of the function's results in rank order."""
    if _elastic(args):
        raise UsageError('elastic mode (--min-np, --max-np, --host-discovery-script) is not supported: '
                         'dshim-run runs jobs of a fixed size; give -np N (hvd.elastic.run and its state work '
                         'inside such a job)')
    if args.num_proc is None or args.num_proc < 1:
        raise UsageError(f'-np {args.num_proc}: give the number of processes, at least 1')
    if args.run_func is not None:
        from horovod.runner import run_func
        return run_func.run(args, launch)
    return launch(args, args.command, os.environ)


def run_commandline(argv=None):
    try:
        args = parse_args(argv)
        if args.check_build:
            check_build(args.verbose)
            sys.exit(0)
        sys.exit(_run(args))
    except UsageError as e:
        print(f'horovodrun: error: {e}', file=sys.stderr)
        sys.exit(USAGE_EXIT)


if __name__ == '__main__':
    run_commandline()
