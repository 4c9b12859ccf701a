"""Gradient compression for horovod.mxnet (Horovod 0.28.1's `Compression`).

A compressor turns an NDArray into the NDArray that travels plus a context, and the reduced
one back with that context.  `DistributedTrainer(compression=...)` calls them around every
gradient's allreduce.
"""


class Compressor(object):
    """What every compressor offers: compress(tensor) -> (tensor, ctx), decompress(tensor, ctx)."""

    @staticmethod
    def compress(tensor):
        """The NDArray to send and the context decompress() needs."""
        pass

    @staticmethod
    def decompress(tensor, ctx):
        """The received NDArray, restored with ctx."""
        pass


class NoneCompressor(Compressor):
    """No compression (the default): the NDArray travels as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point NDArrays travel as float16 and come back in their own type; others as they are."""

    @staticmethod
    def compress(tensor):
        compressed = tensor
        if 'float' in str(tensor.dtype):
            compressed = tensor.astype('float16', copy=False)
        return compressed, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if 'float' in str(ctx):
            return tensor.astype(ctx, copy=False)
        return tensor


class Compression(object):
    """The compressors DistributedTrainer takes: none (default) and fp16."""
    none = NoneCompressor
    fp16 = FP16Compressor
