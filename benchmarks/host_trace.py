"""What a piece of decoding asks of the host, counted on a CPU: kernel launches and host synchronisations.

On a GPU the host queues kernels and runs ahead of them until it needs a value the device computes; then it waits
for everything queued so far (a host synchronisation). Both counts are facts of the code, not of the machine, so
they can be taken on a CPU, where every tensor lives on the host: :class:`HostTrace` follows which tensors would
live on the device and counts, per phase of the work,

* ``triton_launches``: launches of the fused kernels, by kernel (every launcher goes through
  ``dspark.kernels._tuning.launch``);
* ``torch_ops``: PyTorch operations on device tensors that would launch a kernel (not views, not allocations);
* ``host_syncs``: reads of a device tensor's values by the host: ``item()`` and the ``bool()`` / ``int()`` /
  ``float()`` that call it, ``tolist()``, ``.cpu()`` / ``.to("cpu")``, ``.numpy()``, and operations whose output
  size depends on device values (``nonzero``, ``masked_select``, indexing by a boolean mask, ``unique``);
* ``host_to_device``: copies of host values to the device (``.to(device)`` of a host tensor, ``torch.tensor(...,
  device=...)``), which on a GPU also wait for the queue; ``host_to_device_async`` counts those asked with
  ``non_blocking=True`` apart (:func:`dspark.backend.upload`, which pins the host tensor first on a GPU, so the
  copy does not wait).

A tensor is on the device when it is a parameter or buffer of a module passed as ``device_modules``, was made by a
factory told a device (``torch.zeros(..., device=d)``), was moved with ``.to(d)``, or was computed from another
device tensor, where ``d`` is any device but one read off a host tensor: while tracing, a host tensor's ``.device``
is one marked object, so ``lengths.to(x.device)`` stays on the host when ``x`` is a host tensor, as it would on a
GPU. ``.to("cpu")`` with the string names the host, as the library writes a copy back. Everything else (the
decoder's bookkeeping tensors) is host memory and costs nothing here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import traceback
from collections import Counter
from collections.abc import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

# What a host tensor's ``.device`` gives while tracing: a device argument that is this object names the host.
HOST = torch.device("cpu")
KERNEL_MODULES = ("attention", "markov", "confidence", "scheduler", "rejection", "loss")
FACTORIES = ("zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "linspace", "eye", "tensor",
             "zeros_like", "ones_like", "empty_like", "full_like")
# Operations whose output size the device decides: the host waits for it to know the shape.
SIZE_FROM_VALUES = {"aten::nonzero", "aten::masked_select", "aten::_unique2", "aten::unique_dim",
                    "aten::unique_consecutive", "aten::repeat_interleave"}
# Operations that launch nothing: allocations and metadata.
NO_KERNEL = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::lift_fresh", "aten::detach",
             "aten::alias", "aten::_local_scalar_dense", "aten::sym_size", "aten::sym_stride", "aten::sym_numel",
             "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::set_", "aten::resize_"}


class HostTrace(TorchDispatchMode):
    """Count launches, device operations and host synchronisations by phase; see the module docstring.

    ``phase(name)`` (a context manager) attributes what runs inside it to ``name`` (nested phases: the innermost);
    outside any phase, work counts under ``"other"`` (:func:`stubbed_launches` times the launchers' host work
    without their kernels). ``counts[phase]`` is a :class:`collections.Counter` of ``triton_launches``,
    ``torch_ops``, ``host_syncs``, ``host_to_device`` and ``host_to_device_async``, and of ``launch:<kernel>``;
    ``sync_sites`` counts where each synchronisation was asked for (``file:line function``, the innermost frame in
    dspark or kernels code).
    """

    def __init__(self, device_modules: Iterable[torch.nn.Module] = ()):
        super().__init__()
        self.device = WeakTensorKeyDictionary()
        for module in device_modules:
            for tensor in (*module.parameters(), *module.buffers()):
                self.device[tensor] = True
        self.counts: dict[str, Counter] = {}
        self.sync_sites: Counter = Counter()
        self._phases = ["other"]
        self._uncounted = False  # set while a kernel runs (the interpreter's copies are not the host's asking)
        self._patches: list[tuple[object, str, object]] = []

    # -- phases -----------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, name: str):
        self._phases.append(name)
        try:
            yield
        finally:
            self._phases.pop()

    @contextlib.contextmanager
    def uncounted(self):
        saved, self._uncounted = self._uncounted, True
        try:
            yield
        finally:
            self._uncounted = saved

    def wrap(self, owner, attribute: str, name: str) -> None:
        """Run ``owner.attribute`` (a method or function) in phase ``name`` while tracing."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def in_phase(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        self._patch(owner, attribute, in_phase)

    def _count(self, key: str, amount: int = 1) -> None:
        if self._uncounted:
            return
        self.counts.setdefault(self._phases[-1], Counter())[key] += amount

    def _sync(self) -> None:
        if self._uncounted:
            return
        self._count("host_syncs")
        self.sync_sites[_call_site()] += 1

    def reset(self) -> None:
        """Forget the counts so far (what set the work up); which tensors live on the device is kept."""
        self.counts.clear()
        self.sync_sites.clear()

    def on_device(self, tensor) -> bool:
        return isinstance(tensor, torch.Tensor) and tensor in self.device

    def _mark(self, tensors, on_device: bool) -> None:
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                if on_device:
                    self.device[tensor] = True
                else:
                    self.device.pop(tensor, None)

    # -- PyTorch operations -----------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._uncounted:
            return func(*args, **kwargs)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        from_device = any(self.on_device(t) for t in inputs)
        out = func(*args, **kwargs)
        name = func._schema.name
        if from_device:
            mask_index = name in ("aten::index", "aten::index_put_", "aten::index_put") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in tree_flatten(args[1])[0])
            if name == "aten::_local_scalar_dense" or name in SIZE_FROM_VALUES or mask_index:
                self._sync()
            if not func.is_view and name not in NO_KERNEL:
                self._count("torch_ops")
            outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            mutated = [args[0]] if name.endswith("_") and args and isinstance(args[0], torch.Tensor) else []
            self._mark(outputs + mutated + [kwargs.get("out")], True)
        return out

    # -- what does not reach the dispatcher on a CPU ------------------------------------------------------------

    def __enter__(self):
        trace = self
        tensor = torch.Tensor

        def read(method: str) -> Callable:
            original = getattr(tensor, method)

            def reading(self, *args, **kwargs):
                if trace.on_device(self) and not trace._uncounted:
                    trace._sync()
                return original(self, *args, **kwargs)
            return reading

        def to_host(original):
            def copy_back(self, *args, **kwargs):
                if trace._uncounted or not trace.on_device(self):
                    return original(self, *args, **kwargs)
                trace._sync()
                with trace.uncounted():
                    copy = original(self, *args, **kwargs)
                    copy = self.clone() if copy is self else copy
                trace._mark([copy], False)
                return copy
            return copy_back

        original_to = tensor.to

        def to(self, *args, **kwargs):
            where = kwargs.get("device", args[0] if args else None)
            if trace._uncounted:
                return original_to(self, *args, **kwargs)
            if isinstance(where, str) and where.startswith("cpu"):
                return to_host(original_to)(self, *args, **kwargs)
            if isinstance(where, torch.device) and where is not HOST and not trace.on_device(self):
                trace._count("host_to_device_async" if kwargs.get("non_blocking") else "host_to_device")
                moved = original_to(self, *args, **kwargs)
                moved = moved.clone() if moved is self else moved
                trace._mark([moved], True)
                return moved
            return original_to(self, *args, **kwargs)

        real_device = tensor.device

        def device(self):
            return real_device.__get__(self) if trace.on_device(self) else HOST

        self._patch(tensor, "device", property(device))
        self._patch(tensor, "to", to)
        self._patch(tensor, "cpu", to_host(tensor.cpu))
        for method in ("tolist", "numpy"):
            self._patch(tensor, method, read(method))
        for factory in FACTORIES:
            self._patch(torch, factory, self._factory(getattr(torch, factory), factory == "tensor"))
        self._patch_launches()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for owner, attribute, original in reversed(self._patches):
                setattr(owner, attribute, original)
            self._patches.clear()

    def _patch(self, owner, attribute: str, replacement) -> None:
        self._patches.append((owner, attribute, getattr(owner, attribute)))
        setattr(owner, attribute, replacement)

    def _factory(self, original, copies_from_host: bool) -> Callable:
        trace = self

        def make(*args, **kwargs):
            made = original(*args, **kwargs)
            if kwargs.get("device") not in (None, HOST) and not trace._uncounted:
                if copies_from_host:
                    trace._count("host_to_device")
                trace._mark([made], True)
            return made
        return make

    def _patch_launches(self) -> None:
        from dspark.kernels import _tuning

        trace = self

        def counted(name, kernel, grid, args, constexprs, **options):
            trace._count("triton_launches")
            trace._count(f"launch:{name}")
            with trace.uncounted():
                _tuning.launch(name, kernel, grid, args, constexprs, **options)
            # What a kernel writes is device memory.
            trace._mark([a for a in args if isinstance(a, torch.Tensor)], True)

        for module in KERNEL_MODULES:
            loaded = importlib.import_module(f"dspark.kernels.{module}")
            if hasattr(loaded, "launch"):
                self._patch(loaded, "launch", counted)


@contextlib.contextmanager
def stubbed_launches():
    """Run the fused ops' launchers without their kernels: each launch only picks its config. What is left of a
    call is the host's work around its kernels (checks, allocations, config selection, Python)."""
    from dspark.kernels import _tuning

    def config_only(name, kernel, grid, args, constexprs, *, device, table, key, fits=lambda c: True,
                    tunable=True, config=None):
        if config is None:
            _tuning.select_config(name, device, table, fits, key, None)

    saved = []
    for module in KERNEL_MODULES:
        loaded = importlib.import_module(f"dspark.kernels.{module}")
        if hasattr(loaded, "launch"):
            saved.append((loaded, loaded.launch))
            loaded.launch = config_only
    try:
        yield
    finally:
        for loaded, original in saved:
            loaded.launch = original


def _call_site() -> str:
    """``file:line function`` of the innermost frame in the library (dspark, kernels) that asked for a value."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = frame.filename.replace("\\", "/")
        if ("/dspark/" in path or "/kernels/" in path) and "host_trace" not in path:
            short = path[path.rfind("/dspark/") + 1:] if "/dspark/" in path else path[path.rfind("/kernels/") + 1:]
            return f"{short}:{frame.lineno} {frame.name}"
    return "elsewhere"
