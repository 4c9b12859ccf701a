"""Gradient compression for horovod.torch (Horovod 0.28.1's `Compression`).

A compressor turns a tensor into the tensor that travels plus a context, and the reduced tensor
back with that context.  `DistributedOptimizer` calls them around every gradient's allreduce;
`hvd.allreduce(..., compression=...)` around a single one.
"""
import torch


class Compressor(object):
    """What every compressor offers: compress(tensor) -> (tensor, ctx), decompress(tensor, ctx)."""

    @staticmethod
    def compress(tensor):
        """The tensor to send and the context decompress() needs."""
        pass

    @staticmethod
    def decompress(tensor, ctx):
        """The received tensor, restored with ctx."""
        pass


class NoneCompressor(Compressor):
    """Sends the tensor as it is (the default)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own dtype; other dtypes
    travel unchanged (the context is the original dtype either way)."""

    @staticmethod
    def compress(tensor):
        original = tensor.dtype
        if original.is_floating_point:
            return tensor.type(torch.float16), original
        return tensor, original

    @staticmethod
    def decompress(tensor, ctx):
        if ctx.is_floating_point:
            return tensor.type(ctx)
        return tensor


class Compression(object):
    """The compressors by name: Compression.none (default), Compression.fp16."""
    none = NoneCompressor
    fp16 = FP16Compressor
