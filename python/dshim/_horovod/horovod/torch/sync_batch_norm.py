"""hvd.SyncBatchNorm (Horovod 0.28.1): batch normalization whose batch statistics are those of
the whole global batch, every rank's samples together.

Forward: each rank computes its per-channel mean and inverse standard deviation and its sample
count; the three are allgathered and torch combines them into the global statistics (and the
running estimates).  Backward: the two per-channel sums the input gradient needs are allreduced
(Sum).  The weight and bias gradients stay local: the optimizer's allreduce reduces them.  The
operations carry Horovod's fixed names (sync_batch_norm.count/.mean/.invstd/.sum_dy/.sum_dy_xmu).

As in Horovod, training mode takes CUDA tensors only (the torch kernels it calls); eval mode
normalizes with the running statistics, locally.
"""
import torch
import torch.nn.functional as F

from torch.autograd.function import Function
from torch.nn.modules.batchnorm import _BatchNorm

from horovod.torch.mpi_ops import allgather_async, allreduce_async, Sum, size, synchronize


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over N-dimensional input (N, C, ...) with statistics synchronized
    across all ranks in training mode; see torch.nn.BatchNorm2d for the arguments.

    num_features: C; eps: added to the variance (default 1e-5); momentum: of the running
    statistics (default 0.1); affine: learnable weight and bias (default True);
    track_running_stats: keep running statistics for eval mode (default True).

    Only GPU input tensors are supported in training mode.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError('expected at least 2D input (got {}D input)'.format(input.dim()))

    def _run_bn(self, input):
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training or not self.track_running_stats, self.momentum, self.eps)

    @torch.jit.unused
    def _maybe_run_sync_bn(self, input):
        if size() == 1:
            return self._run_bn(input)
        return _SyncBatchNorm.apply(input, self.weight, self.bias, self.running_mean,
                                    self.running_var, self.eps, self.momentum)

    def forward(self, input):
        if not input.is_cuda:
            raise ValueError('SyncBatchNorm expected input tensor to be on GPU')
        self._check_input_dim(input)

        if self.training and self.track_running_stats:
            self.num_batches_tracked = self.num_batches_tracked + 1
        if not self.training and self.track_running_stats:
            return self._run_bn(input)
        return self._maybe_run_sync_bn(input)


class _SyncBatchNorm(Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        input = input.contiguous()

        count = torch.tensor([input.numel() // input.size(1)])
        mean, invstd = torch.batch_norm_stats(input, eps)

        # all three in flight before the first wait
        count_h = allgather_async(count.unsqueeze(0), name='sync_batch_norm.count')
        mean_h = allgather_async(mean.unsqueeze(0), name='sync_batch_norm.mean')
        invstd_h = allgather_async(invstd.unsqueeze(0), name='sync_batch_norm.invstd')
        count_all = synchronize(count_h)
        mean_all = synchronize(mean_h)
        invstd_all = synchronize(invstd_h)

        # the global statistics, weighted by each rank's count; updates the running ones
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            input, mean_all, invstd_all, running_mean, running_var, momentum, eps,
            count_all.view(-1).float().to(input.device))

        ctx.save_for_backward(input, weight, mean, invstd, count_all)
        return torch.batch_norm_elemt(input, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, grad_output):
        grad_output = grad_output.contiguous()
        saved_input, weight, mean, invstd, count_all = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[0:3]

        sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
            grad_output, saved_input, mean, invstd, weight, need_input, need_weight, need_bias)

        grad_input = None
        if need_input:
            sum_dy_h = allreduce_async(sum_dy, op=Sum, name='sync_batch_norm.sum_dy')
            sum_dy_xmu_h = allreduce_async(sum_dy_xmu, op=Sum, name='sync_batch_norm.sum_dy_xmu')
            sum_dy = synchronize(sum_dy_h)
            sum_dy_xmu = synchronize(sum_dy_xmu_h)
            # the kernel wants every rank's count, as int32 on the gradient's device
            counts = count_all.to(dtype=torch.int, device=grad_output.device)
            grad_input = torch.batch_norm_backward_elemt(
                grad_output, saved_input, mean, invstd, weight, sum_dy, sum_dy_xmu, counts)

        # weight and bias gradients are left local: the optimizer's allreduce combines them
        if weight is None or not need_weight:
            grad_weight = None
        if weight is None or not need_bias:
            grad_bias = None
        return grad_input, grad_weight, grad_bias, None, None, None, None
