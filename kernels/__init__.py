"""Fused Triton kernels, installed as ``dspark.kernels``.

Importing this package does not import Triton: each launcher's module is imported (and Triton with it)
on first use. Kernels never import dspark.reference; the tests hold them to it. Every launcher has the
signature of the public op it serves (``backend="triton"``), whose inputs are validated by that op.
"""

import importlib
import os
import sys
import types

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
    launcher = getattr(importlib.import_module(f"dspark.kernels.{_LAUNCHERS[name]}"), name)
    globals()[name] = launcher  # later lookups find it without this hook (each public op's call does one)
    return launcher


def _hand_over_the_bare_name() -> None:
    """Make ``import kernels`` give the installed ``kernels`` distribution, as if this folder were absent.

    With the repository root on ``sys.path`` (``python -m`` or a notebook started there, pytest, the
    benchmark scripts) this folder is found under the bare name ``kernels``, which belongs to the Hugging
    Face distribution that transformers imports. The import system returns whatever ``sys.modules``
    holds once this file has run, so putting the real module there hands the name over. Where that
    distribution is not installed, the name gets an empty module with no file and no version: what a folder
    without ``__init__`` would give, and what transformers' probe reads as "not installed" (an import error
    here would break ``import transformers`` instead).
    """
    root = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    saved_path = sys.path[:]
    del sys.modules["kernels"]
    sys.path[:] = [p for p in saved_path if os.path.realpath(p or os.getcwd()) != root]
    try:
        importlib.import_module("kernels")
    except ModuleNotFoundError as missing:
        if missing.name != "kernels":
            raise
        sys.modules["kernels"] = types.ModuleType("kernels")
    finally:
        sys.path[:] = saved_path


if __name__ == "kernels":
    _hand_over_the_bare_name()
