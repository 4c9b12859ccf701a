"""Thread helpers of horovod.runner.util.threads (Horovod 0.28.1), which scripts and Horovod's
own test helpers (test/utils/common.py: delay() runs in_thread) import."""
import queue
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Starts target(*args) in a new thread and returns the thread.  args must be a tuple;
    silent swallows whatever target raises."""
    if not isinstance(args, tuple):
        raise ValueError('args must be a tuple, not {}, for a single argument use (arg,)'.format(type(args)))
    fn = target
    if silent:
        def fn(*a):
            try:
                target(*a)
            except BaseException:
                pass
    thread = threading.Thread(target=fn, args=args, name=name)
    thread.daemon = daemon
    thread.start()
    return thread


def on_event(event, func, args=(), stop=None, check_stop_interval_s=1.0, daemon=True, silent=False):
    """A thread that runs func(*args) once event is set; with stop, it ends without calling func
    when stop is set first (checked every check_stop_interval_s).  A non-daemon thread needs stop."""
    if event is None:
        raise ValueError('Event must not be None')
    if not isinstance(args, tuple):
        raise ValueError('args must be a tuple, not {}, for a single argument use (arg,)'.format(type(args)))
    if stop is None:
        if not daemon:
            raise ValueError('Stop event must be given for non-daemon event thread')

        def wait_then_call():
            event.wait()
            func(*args)
    else:
        def wait_then_call():
            while not event.is_set() and not stop.is_set():
                event.wait(timeout=check_stop_interval_s)
            if not stop.is_set():
                func(*args)
    return in_thread(wait_then_call, daemon=daemon, silent=silent)


def execute_function_multithreaded(fn, args_list, block_until_all_done=True, max_concurrent_executions=1000):
    """fn(*args) for every args of args_list on up to max_concurrent_executions threads.  Blocking:
    returns {index in args_list: result}, RuntimeError when some call did not complete; else None.
    (Each args list gets its index appended, as Horovod's does.)"""
    results = queue.Queue()
    work = queue.Queue()
    for i, arg in enumerate(args_list):
        arg.append(i)
        work.put(arg)

    def worker():
        while True:
            try:
                arg = work.get(block=False)
            except queue.Empty:
                return
            results.put((arg[-1], fn(*arg[:-1])))

    threads = [in_thread(target=worker, daemon=not block_until_all_done)
               for _ in range(min(max_concurrent_executions, len(args_list)))]
    if not block_until_all_done:
        return None
    # short joins: a single join() would not let a signal (Ctrl-C) through
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.1)
    done = {}
    while not results.empty():
        index, value = results.get()
        done[index] = value
    if len(done) != len(args_list):
        raise RuntimeError('Some threads for func {func} did not complete successfully.'.format(func=fn.__name__))
    return done
