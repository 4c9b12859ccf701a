"""Elastic training's state machinery, shared by the frameworks (Horovod 0.28.1's
horovod.common.elastic): State, ObjectState and run_fn, the loop behind hvd.elastic.run.

A State is committed (saved in host memory) by the script from time to time; when a collective
fails (HorovodInternalError: a rank died) the state goes back to the last commit, the
framework is re-initialized and the state is synchronized from rank 0 before the training
function runs again.  When the launcher announces that hosts were added or removed
(HostsUpdatedInterrupt, raised at the next commit or check_host_updates on every rank at once),
the same reset happens without going back to the commit.
"""
import functools
import queue

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.runner.elastic.worker import HostUpdateResult, WorkerNotificationManager


# the process's listener for the launcher's host updates (does nothing outside an elastic job)
notification_manager = WorkerNotificationManager()


class State(object):
    """State kept in host memory and synchronized across workers.

    Args:
        bcast_object: broadcasts a Python object from rank 0 to the other workers.
        get_rank: returns this worker's current rank.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called after every reset (a worker added or removed), e.g. to scale the
        learning rate with the new number of workers."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        self._host_messages.put((timestamp, update_res))

    def commit(self):
        """Saves the state (a copy in host memory: commit less often than every batch where
        that copy is costly), then raises HostsUpdatedInterrupt if hosts changed."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt, on every worker alike, once the launcher has announced
        a change of hosts newer than the last one seen."""
        prev_timestamp = newest = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, res = self._host_messages.get()
            if timestamp > newest:
                newest = timestamp
                update |= res

        # rank 0's view decides, so that every worker raises (or not) at the same commit
        prev_timestamp, self._last_updated_timestamp, update = \
            self._bcast_object((prev_timestamp, newest, update))
        if self._last_updated_timestamp > prev_timestamp:
            raise HostsUpdatedInterrupt(update == HostUpdateResult.removed)

    def save(self):
        """Saves the state to host memory."""
        raise NotImplementedError()

    def restore(self):
        """Goes back to the last committed state."""
        raise NotImplementedError()

    def sync(self):
        """Makes every worker's state rank 0's."""
        raise NotImplementedError()

    def reset(self):
        """Called after a reset event, before the state is synchronized."""
        pass


class ObjectState(State):
    """State of plain Python objects, given as keyword arguments and exposed as attributes.

    Args:
        bcast_object: broadcasts the saved attributes from rank 0.
        get_rank: returns this worker's current rank.
        kwargs: the attributes and their initial values.
    """

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super(ObjectState, self).__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def run_fn(func, reset):
    """func(state, ...) run until it returns: after a failed collective the state is restored
    to its last commit, after a host update it is kept; then reset() re-initializes the
    framework, state.on_reset() runs and (unless the update said it may be skipped) the state is
    synchronized from rank 0 before func runs again."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        notification_manager.init()
        notification_manager.register_listener(state)
        skip_sync = False
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError:
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as e:
                    skip_sync = e.skip_sync
                reset()
                state.on_reset()
        finally:
            notification_manager.remove_listener(state)
    return wrapper
