"""Atomic writes: whole files or nothing, with the modes any other tool's files get."""

import os
import stat

import pytest
import safetensors.torch
import torch

from dspark.io import atomic_directory, atomic_write_text


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_files_and_folders_get_the_modes_the_umask_gives(tmp_path, umask_022):
    atomic_write_text(tmp_path / "notes.txt", "hello")
    with atomic_directory(tmp_path / "drafter") as tmp:
        (tmp / "config.json").write_text("{}", encoding="utf-8")
        safetensors.torch.save_file({"w": torch.zeros(2)}, tmp / "model.safetensors")  # written 0o600
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "hello"
    # Temporary files and folders are private (0o600, 0o700) until renamed; the results must not stay so.
    assert mode(tmp_path / "notes.txt") == 0o644
    assert mode(tmp_path / "drafter") == 0o755
    assert mode(tmp_path / "drafter" / "config.json") == mode(tmp_path / "drafter" / "model.safetensors") == 0o644


def test_a_failed_write_leaves_what_was_there(tmp_path):
    atomic_write_text(tmp_path / "notes.txt", "first")
    with pytest.raises(RuntimeError):
        with atomic_directory(tmp_path / "notes-dir"):
            raise RuntimeError("killed mid-write")
    assert not (tmp_path / "notes-dir").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "first"
