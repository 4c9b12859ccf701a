"""A worker's side of elastic host updates (Horovod 0.28.1's horovod.runner.elastic.worker):
HostUpdateResult, HostsUpdatedRequest and WorkerNotificationManager.

The manager fans host updates out to its listeners (the elastic State objects of
hvd.elastic.run), which turn the newest one into a HostsUpdatedInterrupt at the next commit.
Updates come from the launcher's elastic mode through handle_hosts_updated(); a process that
no elastic launcher started (plain python, dshim-run, horovodrun without --min-np/--max-np)
never receives one, so init() has nothing to connect to there.
"""
from enum import IntFlag


class HostUpdateResult(IntFlag):
    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class HostsUpdatedRequest(object):
    """Tells a worker that the set of available hosts/slots changed."""

    def __init__(self, timestamp, res=HostUpdateResult.no_update):
        self.timestamp = timestamp
        self.res = res


class WorkerNotificationManager(object):
    def __init__(self):
        self._listeners = set()

    def init(self, rendezvous_addr=None, rendezvous_port=None,
             nic=None, hostname=None, local_rank=None):
        """Idempotent.  Horovod registers a notification service with its elastic driver here;
        without an elastic launcher there is no driver to announce updates, and nothing to do."""

    def register_listener(self, listener):
        self._listeners.add(listener)

    def remove_listener(self, listener):
        self._listeners.remove(listener)

    def handle_hosts_updated(self, timestamp, update_res):
        for listener in self._listeners:
            listener.on_hosts_updated(timestamp, update_res)

    def _create_id(self, hostname, local_rank):
        return '{}:{}'.format(hostname, local_rank)
