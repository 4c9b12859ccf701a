"""ElasticSampler (Horovod 0.28.1): DistributedSampler's partitioning that can go on, after a
reset, with the samples of the epoch not processed yet, split among the new set of workers."""
import math
import random

import torch.utils.data

from horovod.torch.mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions a dataset across ranks and repartitions what is left of the epoch after a
    reset.

    Put it in a TorchState, call record_batch after each batch and set_epoch at the END of each
    epoch (so that a partly done epoch is not done again).

    Args:
        dataset: the dataset (its size must not change).
        shuffle: shuffle the indices (default True), alike on every rank.
        seed: the shuffle's seed, the same on every rank (default 0).
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed

        self.epoch = 0
        self.processed_indices = set()

        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.processed_num = 0

        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: a new shuffle (with shuffle=True) and nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Counts a batch of batch_size samples as processed on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict):
        self.epoch = state_dict['epoch']
        self.processed_num = state_dict['processed_num']
        self.reset()

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def reset(self):
        self.num_replicas = size()
        self.rank = rank()

        # the epoch's order (the same on every rank), less what was processed already
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]

        self.num_samples = int(math.ceil(len(self.remaining_indices) * 1.0 / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        self.indices = self.remaining_indices[:]
        # padded with its own first indices so that every rank gets num_samples
        self.indices += self.indices[:(self.total_size - len(self.indices))]
        assert len(self.indices) == self.total_size

        self.indices = self.indices[self.rank:self.total_size:self.num_replicas]
        assert len(self.indices) == self.num_samples
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
