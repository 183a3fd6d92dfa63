"""Kernel tests: every output buffer NaN-poisoned, one forced launch config, CUDA when present."""

import dspark.kernels._tuning as tuning
import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    monkeypatch.setattr(tuning, "POISON_OUTPUTS", True)
    monkeypatch.setenv("DSPARK_FORCE_CONFIG", "first")
