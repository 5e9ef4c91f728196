"""Attention backends and kernels. On CPU the torch backend; FlashInfer when CUDA is present."""
