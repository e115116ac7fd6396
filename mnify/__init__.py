"""mnify: make a single-GPU Chainer training script run on many GPUs and many nodes."""

__version__ = "0.1.0"
