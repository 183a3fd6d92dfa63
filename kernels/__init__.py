"""Fused Triton kernels, installed as ``dspark.kernels``.

Importing this package does not import Triton: each launcher's module is imported (and Triton with it)
on first use. Kernels never import dspark.reference; the tests hold them to it. Every launcher has the
signature of the public op it serves (``backend="triton"``), whose inputs are validated by that op.
"""

import importlib

_LAUNCHERS = {
    "block_attention": "attention",
    "markov_sample_block": "markov",
    "confidence_survival": "confidence",
    "schedule_greedy": "scheduler",
    "allocate_top_k": "scheduler",
    "verify": "rejection",
    "fused_dspark_loss": "loss",
}

__all__ = sorted(_LAUNCHERS)


def __getattr__(name):
    if name not in _LAUNCHERS:
        raise AttributeError(f"module 'dspark.kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dspark.kernels.{_LAUNCHERS[name]}"), name)
