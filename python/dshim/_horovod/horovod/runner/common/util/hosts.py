"""Hosts and slots as horovodrun reads them, and Horovod's rank placement.

`-H host1:2,host2:4` and hostfiles of `host slots=N` lines give each host a number of slots;
get_host_assignments fills the hosts in the order given, each host's local ranks in order,
until the requested number of processes is placed (Horovod 0.28.1's rule, which horovodrun's
gloo and MPI modes share).  The cross rank of a slot is its host's index among the hosts that
have its local rank, the cross size how many hosts have it.
"""
import collections
import re
from dataclasses import dataclass

# Horovod's accepted spelling of one -H entry
_HOST_SLOTS = re.compile(r'^[\w.-]+:[0-9]+$')


class HostInfo:
    def __init__(self, hostname, slots):
        self.hostname = hostname
        self.slots = slots

    @staticmethod
    def from_string(host_string):
        hostname, slots = host_string.strip().split(':')
        return HostInfo(hostname, int(slots))

    def __repr__(self):
        return f'HostInfo({self.hostname!r}, {self.slots})'


@dataclass
class SlotInfo:
    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int

    def to_response_string(self):
        return ','.join(str(v) for v in [self.rank, self.size, self.local_rank, self.local_size,
                                         self.cross_rank, self.cross_size])


INVALID_SLOT_INFO = SlotInfo(hostname='', rank=-1, local_rank=-1, cross_rank=-1, size=-1, local_size=-1,
                             cross_size=-1)


def parse_host_files(filename):
    """A hostfile ('<host> slots=<N>' per line; blank lines and '#' comments skipped) as the
    -H string 'host:N,...'.  ValueError naming the file and line for anything else."""
    hosts = []
    with open(filename, 'r') as f:
        for lineno, line in enumerate(f, 1):
            text = line.split('#', 1)[0].strip()
            if not text:
                continue
            words = text.split()
            m = re.fullmatch(r'slots=([0-9]+)', words[1]) if len(words) == 2 else None
            if m is None or not re.fullmatch(r'[\w.-]+', words[0]):
                raise ValueError(f"hostfile '{filename}' line {lineno}: {text!r} is not '<hostname> slots=<N>'")
            hosts.append(f'{words[0]}:{m.group(1)}')
    if not hosts:
        raise ValueError(f"hostfile '{filename}' lists no hosts ('<hostname> slots=<N>' per line)")
    return ','.join(hosts)


def parse_hosts_and_slots(hosts):
    """('host:N,...') -> ([host names in order], {host: slots}); ValueError with Horovod's message."""
    host_names = []
    host_to_slots = {}
    for host in hosts.split(','):
        if not _HOST_SLOTS.match(host.strip()):
            raise ValueError('Invalid host input, please make sure it has format as : worker-0:2,worker-1:2.')
        hostname, slots = host.strip().split(':')
        host_names.append(hostname)
        host_to_slots[hostname] = int(slots)
    return host_names, host_to_slots


def parse_hosts(hosts_string):
    """'host:N,...' as a list of HostInfo (checked as parse_hosts_and_slots checks it)."""
    parse_hosts_and_slots(hosts_string)
    return [HostInfo.from_string(host_string) for host_string in hosts_string.split(',')]


def get_host_assignments(hosts, min_num_proc, max_num_proc=None):
    """The SlotInfo of every rank, in rank order: hosts filled in order up to max_num_proc ranks
    (all slots when None); ValueError when fewer than min_num_proc slots exist."""
    host_ranks = []
    cross_ranks = collections.defaultdict(dict)   # local rank -> {host name: its cross rank}
    rank = 0
    for host_info in hosts:
        ranks = []
        for local_rank in range(host_info.slots):
            if rank == max_num_proc:
                break
            ranks.append(rank)
            rank += 1
            at_local = cross_ranks[local_rank]
            at_local[host_info.hostname] = len(at_local)
        host_ranks.append((host_info, ranks))

    world_size = rank
    if world_size < min_num_proc:
        raise ValueError('Requested more processes ({}) than there are available slots ({})'
                         .format(min_num_proc, world_size))

    alloc_list = []
    for host_info, ranks in host_ranks:
        for local_rank, r in enumerate(ranks):
            at_local = cross_ranks[local_rank]
            alloc_list.append(SlotInfo(hostname=host_info.hostname, rank=r, local_rank=local_rank,
                                       cross_rank=at_local[host_info.hostname], size=world_size,
                                       local_size=len(ranks), cross_size=len(at_local)))
    return alloc_list
