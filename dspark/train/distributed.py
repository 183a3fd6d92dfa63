"""Data-parallel training on torch's own engines: which one runs, and the few helpers around it.

``parallel`` names the engine: ``ddp`` (``DistributedDataParallel``: every rank holds the whole drafter and
its optimiser state; gradients are all-reduced in buckets, overlapped with backward), ``fsdp`` (FSDP2's
``fully_shard``: trained parameters, their gradients and optimiser state sharded over ranks, the
parameters gathered for the forward and backward; frozen ones replicated) or ``none`` (one process).
``auto`` is ``ddp`` under ``torch.distributed`` with more than one rank, else ``none``. Checkpoints are
written whole (gathered to rank 0 through ``torch.distributed.checkpoint.state_dict``), so every engine
reads what any other wrote. :func:`init_from_torchrun` joins a ``torchrun`` job's process group, restarts
included.
"""

from __future__ import annotations

import torch

PARALLEL = ("auto", "none", "ddp", "fsdp")


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if _initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if _initialized() else 1


def barrier() -> None:
    if world_size() > 1:
        torch.distributed.barrier()


def init_from_torchrun(backend: str | None = None) -> None:
    """Join the process group of a ``torchrun`` job: ``nccl`` on a GPU, ``gloo`` on a CPU (or ``backend``).

    Under ``torchrun --max-restarts N`` the ranks of a restarted job meet in the store the first attempt used
    (torch 2.13, ``--standalone``), which still holds that attempt's addresses: a rank that reads its dead
    peer's address fails to connect ("Gloo connectFullMesh failed"), and so does the restart. So each attempt
    keeps its keys under a prefix of its own (``TORCHELASTIC_RESTART_COUNT``).
    """
    import datetime
    import os

    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise ValueError(f"not launched by torchrun: {', '.join(missing)} unset")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    me, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    timeout = datetime.timedelta(minutes=10)
    # torchrun's agent hosts the store when it says so; otherwise rank 0 does, as env:// would have it.
    hosted_by_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                                       is_master=me == 0 and not hosted_by_agent, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    torch.distributed.init_process_group(backend, store=torch.distributed.PrefixStore(f"dspark/attempt{attempt}",
                                                                                      store),
                                         rank=me, world_size=world, timeout=timeout)


def resolve_parallel(parallel: str, sequences_per_step: int) -> str:
    """The engine ``parallel`` means in this process group; ``ValueError`` for a run that cannot work."""
    if parallel not in PARALLEL:
        raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {parallel!r}")
    world = world_size()
    if parallel in ("ddp", "fsdp") and not _initialized():
        raise ValueError(f"parallel={parallel!r} needs torch.distributed initialised: launch with torchrun "
                         f"(or call torch.distributed.init_process_group first)")
    if parallel == "none" and world > 1:
        raise ValueError(f"parallel='none' in a group of {world} processes would train {world} separate drafters: "
                         f"use 'ddp' or 'fsdp'")
    if sequences_per_step % world:
        raise ValueError(f"sequences_per_step ({sequences_per_step}) must be a multiple of the world size ({world}), "
                         f"so that every rank takes the same share of a step")
    if parallel == "auto":
        return "ddp" if world > 1 else "none"
    return parallel


def wrap_for_data_parallel(module: torch.nn.Module, parallel: str, device: torch.device) -> torch.nn.Module:
    """``module`` under the engine ``parallel`` (a :func:`resolve_parallel` result), on ``device``."""
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)
    if parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # One unit, gathered for the forward and freed after it: a draft layer's context keys and values are
        # projected outside the layer's own forward (they are shared by every block), where a per-layer unit
        # would still be sharded. Gradients and optimiser state stay sharded, which is most of the memory.
        # Frozen weights (the target's embedding and LM head) stay whole on every rank: they have no
        # gradient or optimiser state to shard, and gathering them every step would cost more than the rest
        # of the step's communication together (at the CPU recipe's shape, it halved the step's speed).
        frozen = {p for p in module.parameters() if not p.requires_grad}
        fully_shard(module, mesh=init_device_mesh(device.type, (world_size(),)), ignored_params=frozen)
    return module


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded ``DTensor`` gathered whole; any other tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def drafter_name(name: str) -> str:
    """A parameter's name in the drafter, from its name in the wrapped training module."""
    return name.removeprefix("drafter.")


def full_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """``(weights, optimizer state)`` of the wrapped training module as whole CPU tensors, under any engine.

    A collective under FSDP2: every rank calls it, and only rank 0's result is whole. The optimizer state is
    keyed by parameter name: ``{"state": {name: {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [...]}``.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = {k: v.detach().cpu() for k, v in get_model_state_dict(module, options=options).items()}
    optimizer_state = get_optimizer_state_dict(module, optimizer, options=options)
    if not optimizer_state:  # the gathered state lands on rank 0 only
        return weights, {"state": {}, "param_groups": []}
    optimizer_state["state"] = {name: {k: v.detach().cpu() for k, v in state.items()}
                                for name, state in optimizer_state["state"].items()}
    return weights, optimizer_state


def load_full_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
                    optimizer_state: dict[str, dict[str, torch.Tensor]], groups: list[dict]) -> None:
    """Load whole tensors keyed by drafter parameter name (what :func:`full_state` gave) into ``module`` and
    ``optimizer``, sharding them where the engine shards. Every rank calls it with the same tensors."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(module, {f"drafter.{k}": v for k, v in weights.items()}, options=options)
    current = get_optimizer_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=True))
    if len(current["param_groups"]) != len(groups):
        raise ValueError(f"the checkpoint has {len(groups)} optimizer parameter groups, this trainer "
                         f"{len(current['param_groups'])}")
    set_optimizer_state_dict(module, optimizer, {
        "state": {f"drafter.{name}": state for name, state in optimizer_state.items()},
        "param_groups": [{**saved, "params": group["params"]} for saved, group in zip(groups, current["param_groups"])],
    }, options=options)
