"""A rank of horovod.run(): fetches the function from the driver, runs it, sends its result back.

    python -m horovod.runner.run_task PORT

The driver listens on the host where dshim-run runs, which the ranks reach at DSHIM_STORE_ADDR;
requests carry the job's secret, DSHIM_JOB_TOKEN (horovod/runner/run_func.py).  Both are read
through dshim's configuration table.
"""
import sys

import cloudpickle

from horovod.runner import run_func
from horovod.runner.common.util.env import config, get_env_rank_and_size


def main(port):
    addr, token = config('DSHIM_STORE_ADDR'), config('DSHIM_JOB_TOKEN')
    if not addr or not token:
        sys.exit('horovod.runner.run_task: no DSHIM_STORE_ADDR/DSHIM_JOB_TOKEN: run it through horovod.run()')
    func = cloudpickle.loads(run_func.fetch_func(addr, port, token))
    try:
        ret_val = func()
    except BaseException as e:
        sys.stderr.write('User function raise error: {error}'.format(error=str(e)))
        raise
    rank, _ = get_env_rank_and_size()
    run_func.put_result(addr, port, token, rank, cloudpickle.dumps(ret_val))


if __name__ == '__main__':
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit('usage: python -m horovod.runner.run_task PORT')
    main(int(sys.argv[1]))
