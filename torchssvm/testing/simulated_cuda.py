"""A simulated CUDA device on a CPU-only torch: tensors that say ``cuda:0`` and compute on the CPU, with CUDA's
device rules enforced and host synchronisations counted.

Running the CUDA tests with the CPU standing in for the GPU (``device="cpu"``) misses two kinds of GPU failure:
code taken only for CUDA tensors (``device.type == "cuda"`` branches: the box QP's torch Newton iteration, the
non-CPU Viterbi paths) never runs, and a tensor made without ``device=`` lands on the same CPU as everything
else. Under `simulated_cuda()`:

- ``device="cuda"`` works: factories, ``.to("cuda")`` and ``.cuda()`` give a `SimulatedCudaTensor`, a wrapper
  subclass whose Python ``.device`` is ``cuda:0`` and whose data is a CPU tensor (``.inner``). Its C++ device is
  ``meta`` (a CPU build has no CUDA device guard), so tensors that composite ops create internally with the
  wrapper's options come to the mode as device tensors too.
- Every aten op goes through `SimulatedCuda.__torch_dispatch__`, which runs it on the CPU data and wraps the
  results when an input was on the device. An op that mixes device tensors with CPU tensors of one or more
  dimensions raises the error a GPU raises (0-dim CPU tensors, copies and CPU index tensors are allowed, as
  on CUDA). In-place and ``out=`` ops return their argument itself; in-place shape changes are applied to the
  wrapper's metadata as well.
- ``mode.syncs`` counts the operations that make the host wait for the device: reading values (``.item()``,
  ``bool()``, ``.tolist()``), copies to the CPU, ops whose output shape depends on values (``nonzero``,
  boolean-mask reads, ``unique``, ...), boolean-mask writes of anything but a Python scalar, and blocking
  copies from the host (CUDA's ``memcpy_and_sync``: ``.to("cuda")`` without ``non_blocking=True``,
  ``torch.tensor(..., device="cuda")``, a CPU index tensor or list given to a device tensor, a Python number
  assigned into one: ``t[0] = 1.0`` copies a 0-dim host tensor, where ``t[0].fill_(1.0)`` launches a fill);
  ``mode.sync_sites`` counts them by the library line that asked.
- ``mode.launches`` counts the ops that would launch a kernel or a copy on the device (not views or bare
  allocations; a composite op counts as the ops it is made of), ``mode.launch_sites`` by library function: on a
  GPU each costs the host some microseconds however small the tensors.
- Triton kernels run in the interpreter (``TRITON_INTERPRET=1``) on the wrapped CPU storage; each launch on
  device tensors counts as one kernel launch.

- CUDA graphs: ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph`` record the device work of the captured code
  (its aten ops and Triton launches on device tensors) and ``replay()`` runs it again on the same tensors, one
  counted launch. As on a GPU the capture itself leaves memory that existed before it unchanged (its writes
  there are undone when it ends), host code runs only at capture, and a host wait or a copy from the host inside
  it raises (`SimulatedGraph`).

It simulates placement, not numerics or speed: results are those of the CPU kernels. A non-blocking copy from
the host is not counted; on CUDA it is queued only from pinned memory (`torchssvm._device.host_to_device`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten
CUDA = torch.device("cuda", 0)
META = torch.device("meta")

# Ops that may take CPU tensors alongside device tensors on a real GPU.
_CROSS_DEVICE_OK = {aten.copy_.default, aten._to_copy.default, aten.index.Tensor, aten.index_put_.default,
                    aten._index_put_impl_.default, aten.index_put.default, aten.lift_fresh.default,
                    aten.set_.source_Storage_storage_offset,
                    aten._pack_padded_sequence.default}  # its lengths must be on the CPU
# Outputs that stay on the CPU on a GPU (by position).
_CPU_OUTPUTS = {aten._pack_padded_sequence.default: {1}}  # batch_sizes
# Ops whose output shape depends on the values (the host waits for the device to learn it), and more.
_DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten.unique_dim.default,
                   aten._unique2.default, aten.unique_consecutive.default, aten.repeat_interleave.Tensor,
                   aten.bincount.default,
                   # and ops that return a host value or check one: torch.equal, linalg's error flags
                   aten.equal.default, aten._linalg_check_errors.default}


class SimulatedCudaTensor(torch.Tensor):
    """A tensor on the simulated device: metadata says ``cuda:0``, ``inner`` holds the data on the CPU."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        # The C++ side says "meta" (a CPU build has no CUDA device guard; meta has one and holds no data), so
        # tensors that composite ops create with ``self.options()`` come to the mode as meta, that is device,
        # tensors. Python code sees `device` below.
        kw = dict(dtype=inner.dtype, device=META, requires_grad=inner.requires_grad, layout=inner.layout)
        if inner.layout == torch.strided:
            kw.update(strides=inner.stride(), storage_offset=inner.storage_offset())
        out = torch.Tensor._make_wrapper_subclass(cls, inner.shape, **kw)
        out.inner = inner
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:
        return f"SimulatedCudaTensor({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"a simulated CUDA tensor was used outside simulated_cuda() (in {func})")

    @property
    def device(self) -> torch.device:
        return CUDA

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def is_cpu(self) -> bool:
        return False

    def get_device(self) -> int:
        return 0

    def cpu(self, memory_format=torch.preserve_format):
        return torch.ops.aten._to_copy.default(self, device=torch.device("cpu"), memory_format=memory_format)

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        return self

    def to(self, *args, **kwargs):
        return _to(self, *args, **kwargs)

    # Python lists in an index become index tensors on ``self``'s C++ device, meta: without data. Give them to
    # C++ as CPU tensors instead (CUDA takes CPU index tensors).
    def __getitem__(self, index):
        return super().__getitem__(_cpu_lists(index))

    def __setitem__(self, index, value):
        if isinstance(value, (bool, int, float)):  # CUDA makes a Python value a host scalar (`masked_fill_` path)
            value = torch.tensor(value, dtype=self.dtype)
        return super().__setitem__(_cpu_lists(index), value)

    # The Triton interpreter copies kernel arguments through their storage.
    def untyped_storage(self):
        return self.inner.untyped_storage()

    def data_ptr(self) -> int:
        return self.inner.data_ptr()

    def tolist(self):
        mode = getattr(SimulatedCuda, "active", None)
        if mode is None:
            raise RuntimeError("a simulated CUDA tensor was used outside simulated_cuda() (in tolist)")
        mode.count_sync()
        return self.inner.tolist()

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                        "to host memory first.")

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        return torch.tensor(data, dtype=dtype or self.dtype, device=device or self.device,
                            requires_grad=requires_grad)


_PLAIN_TO = torch.Tensor.to


def _cpu_lists(index):
    if isinstance(index, list):
        return torch.tensor(index) if index else torch.tensor(index, dtype=torch.long)
    if isinstance(index, tuple):
        return tuple(_cpu_lists(i) for i in index)
    return index


def _to(self, *args, **kwargs):
    """`Tensor.to` for both kinds of tensors: moves to and from the simulated device through `aten._to_copy`
    (the C++ `to` would look for a CUDA device guard, which a CPU build does not have)."""
    copy = kwargs.pop("copy", False)  # a move copies anyway
    device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
    here = isinstance(self, SimulatedCudaTensor)
    if device is None or (device.type == "cuda") == here:  # no move
        if (dtype is None or dtype == self.dtype) and not copy:
            return self
        if not here:
            return _PLAIN_TO(self, *args, copy=copy, **kwargs)
        return torch.ops.aten._to_copy.default(self, dtype=dtype)
    extra = {"dtype": dtype} if dtype is not None else {}
    if non_blocking:
        extra["non_blocking"] = True
    return torch.ops.aten._to_copy.default(self, device=CUDA if device.type == "cuda" else device, **extra)


def _is_cuda(device) -> bool:
    if device is None:
        return False
    if isinstance(device, int):  # a bare index means a CUDA device
        return True
    return torch.device(device).type in ("cuda", "meta")


class SimulatedCuda(TorchDispatchMode):
    """The dispatch mode behind `simulated_cuda`."""

    active: SimulatedCuda

    def __init__(self):
        super().__init__()
        self.syncs = 0
        self.sync_sites: collections.Counter = collections.Counter()  # "file:line" of the library code
        self.launches = 0
        self.launch_sites: collections.Counter = collections.Counter()  # "file:function" of the library code
        self.capture: Optional[_Capture] = None  # the CUDA graph being captured

    def count_sync(self) -> None:
        if self.capture is not None:
            raise RuntimeError("simulated CUDA: operation not permitted when stream is capturing (the host waits "
                               "for the device inside a CUDA graph capture)")
        self.syncs += 1
        self.sync_sites[_library_site(sys._getframe(1), lambda f: f.f_lineno)] += 1

    def count_launch(self) -> None:
        self.launches += 1
        self.launch_sites[_library_site(sys._getframe(1), lambda f: f.f_code.co_name)] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        flat, _ = tree_flatten((args, kwargs))
        on_device = any(isinstance(t, SimulatedCudaTensor) for t in flat)
        plain = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, SimulatedCudaTensor)]
        if any(t.is_meta for t in plain):
            raise NotImplementedError(f"simulated CUDA: {func} got a tensor without data (made by C++ on the "
                                      "wrapper's meta device); the simulation cannot run it")
        to_device = _is_cuda(kwargs.get("device"))
        if "device" in kwargs and to_device:
            kwargs["device"] = torch.device("cpu")
        if on_device and func not in _CROSS_DEVICE_OK:
            cpu = [t for t in plain if t.dim() > 0]
            if cpu:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                                   f"devices, cuda:0 and cpu! (simulated CUDA, in {func}: CPU tensors of shapes "
                                   f"{[tuple(t.shape) for t in cpu]})")
        if (on_device or to_device) and _waits_for_device(func, args, kwargs, to_device):
            self.count_sync()
        if (on_device or to_device) and _launches(func):
            self.count_launch()
        capture = self.capture if on_device or to_device else None
        if capture is not None:
            if func in (aten._to_copy.default, aten.copy_.default) and plain:
                raise RuntimeError("simulated CUDA: a copy from the host inside a CUDA graph capture (the graph would "
                                   "replay it from host memory that may have changed since)")
            capture.before_write(_written_inputs(func, args, kwargs))
        out = func(*_unwrap(args), **_unwrap(kwargs))
        if kwargs.get("device") is not None and not to_device:  # an explicit CPU result: new_empty(device="cpu")
            if on_device and func is aten._to_copy.default:
                self.count_sync()  # a copy to the host waits for the device
            return out
        if not (on_device or to_device):
            return out
        result = self._device_result(func, args, kwargs, out)
        if capture is not None:
            capture.record_op(func, args, kwargs, result)
        return result

    def _device_result(self, func, args, kwargs, out):
        """The op's result as the device gives it: its written argument, or its CPU outputs wrapped."""
        written = _written_args(func, args, kwargs)
        if written is not None:  # in-place and out= ops return their (mutated) argument itself
            for t in written:
                if _out_of_step(t):
                    # squeeze_, resize_, ...: apply the op to the wrapper's own (meta) metadata as well
                    with torch._C._DisableTorchDispatch():
                        func(*args, **kwargs)
                    if _out_of_step(t):
                        raise NotImplementedError(f"simulated CUDA: cannot follow {func} on a device tensor")
            return written[0] if len(written) == 1 else tuple(written)
        if func in _CPU_OUTPUTS:
            return tuple(o if i in _CPU_OUTPUTS[func] else _wrap(o) for i, o in enumerate(out))
        return _wrap(out)


_INDEX_WRITES = {aten.index_put_.default, aten._index_put_impl_.default, aten.index_put.default}


def _waits_for_device(func, args, kwargs, to_device: bool) -> bool:
    """Whether the op, with a device tensor among its inputs or a device result, makes the host wait for the
    device on CUDA: a value read, an output shape that depends on values, a boolean-mask index (read, or write
    of anything but one host scalar, which CUDA turns into ``masked_fill_``), or a blocking copy from host
    memory (``memcpy_and_sync``), which includes a CPU index tensor given to a device tensor."""
    if func is aten._local_scalar_dense.default or func in _DATA_DEPENDENT:
        return True
    if func is aten._to_copy.default:
        src = args[0]
        return to_device and not isinstance(src, SimulatedCudaTensor) and not kwargs.get("non_blocking", False)
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return (isinstance(dst, SimulatedCudaTensor) and not isinstance(src, SimulatedCudaTensor)
                and not non_blocking)
    if func is aten.index.Tensor or func in _INDEX_WRITES:
        indices = [i for i in args[1] if i is not None]
        if any(not isinstance(i, SimulatedCudaTensor) and i.dim() > 0 for i in indices):
            return True  # the index is copied to the device first
        if not any(i.dtype == torch.bool for i in indices):
            return False
        if func is aten.index.Tensor:
            return True
        value = args[2]
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        scalar_fill = (len(indices) == 1 and not accumulate and value.numel() == 1
                       and not isinstance(value, SimulatedCudaTensor))
        return not scalar_fill
    return False


@functools.cache
def _library_roots():
    """((folder, prefix), ...) of the library's code, the kernels first (an installed copy may nest them in the
    package), and the folder of this subpackage, which is not library code: the real package directories, never
    a guess from a path's folder names (a checkout may well be called ``torchssvm``)."""
    import torchssvm
    import torchssvm.kernels

    package = Path(torchssvm.__file__).resolve().parent
    kernels = Path(torchssvm.kernels.__file__).resolve().parent
    return ((kernels, "kernels"), (package, "")), package / "testing"


@functools.lru_cache(maxsize=4096)
def _library_path(filename: str) -> Optional[str]:
    """The path in the library of the file ``filename`` (``"optim/frank_wolfe/bcfw.py"``,
    ``"kernels/chain/dispatch.py"``, ``"torchssvm/losses.py"`` for a top-level module), or None for a file outside
    it: tests, scripts, torch, ``<string>``, and `torchssvm.testing` itself."""
    if filename.startswith("<"):
        return None
    roots, testing = _library_roots()
    try:
        path = Path(filename).resolve()
    except (OSError, RuntimeError):
        return None
    if _inside(path, testing):
        return None
    for root, prefix in roots:
        if _inside(path, root):
            inside = path.relative_to(root).as_posix()
            if prefix:
                return f"{prefix}/{inside}"
            return inside if "/" in inside else f"torchssvm/{inside}"
    return None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _library_site(frame, where) -> str:
    """``"path/in/the/package.py:where(frame)"`` of the innermost library frame (not this package's) from
    ``frame`` out, library code being the files under the directories of `torchssvm` and `torchssvm.kernels`."""
    while frame is not None:
        inside = _library_path(frame.f_code.co_filename)
        if inside is not None:
            return f"{inside}:{where(frame)}"
        frame = frame.f_back
    return "<outside the library>"


# Ops on device tensors that launch no kernel: allocations without a fill, and reads of a scalar (a copy, counted
# as a wait). Views are recognised from their schema.
_NO_KERNEL = {aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
              aten.new_empty_strided.default, aten._local_scalar_dense.default, aten.lift_fresh.default}


@functools.cache
def _launches(func) -> bool:
    """Whether ``func`` runs a device kernel (or a copy): not a view, not a bare allocation."""
    if func in _NO_KERNEL:
        return False
    return not any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _unwrap(tree):
    return tree_map(lambda t: t.inner if isinstance(t, SimulatedCudaTensor) else t, tree)


def _wrap(tree):
    return tree_map(lambda t: SimulatedCudaTensor(t) if isinstance(t, torch.Tensor)
                    and not isinstance(t, SimulatedCudaTensor) else t, tree)


def _out_of_step(t) -> bool:
    """Whether an in-place op changed the shape of a device tensor's data but not of the wrapper."""
    return isinstance(t, SimulatedCudaTensor) and (t.shape != t.inner.shape or t.stride() != t.inner.stride())


def _written_args(func, args, kwargs):
    """The arguments an in-place or ``out=`` op returns (its schema's written aliases), or None."""
    returns = func._schema.returns
    if not returns or not all(r.alias_info is not None and r.alias_info.is_write for r in returns):
        return None
    by_set = {frozenset(a.alias_info.before_set): value for a, value in _written_arguments(func, args, kwargs)}
    written = [by_set.get(frozenset(r.alias_info.before_set)) for r in returns]
    return None if any(w is None for w in written) else written


def _written_arguments(func, args, kwargs):
    """``(schema argument, value)`` of each argument the op's schema marks as written."""
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            yield a, kwargs[a.name] if a.name in kwargs else (args[i] if i < len(args) else None)


def _written_inputs(func, args, kwargs) -> list:
    """Every tensor the op's schema marks as written (``out=``, in-place, and ops that write an argument without
    returning it: ``_foreach_*_``, batch norm's running statistics), lists of tensors flattened."""
    return [t for _, value in _written_arguments(func, args, kwargs) for t in tree_flatten(value)[0]
            if isinstance(t, torch.Tensor)]


def _tensor_factory(original):
    """``torch.tensor``/``torch.as_tensor`` build their result below the dispatcher: build on the CPU, then move."""
    copies = original.__name__ == "tensor"  # torch.tensor copies its data, torch.as_tensor need not (compared by
    # name: inside the patch, torch.tensor is the patched function)

    @functools.wraps(original)
    def factory(data, *args, device=None, **kwargs):
        # requires_grad is set after the move: a tensor built with it and then moved would not be a leaf
        requires_grad = bool(kwargs.pop("requires_grad", False))
        if isinstance(data, SimulatedCudaTensor) and (device is None or _is_cuda(device)):
            # as on a GPU: as_tensor returns the device tensor itself, tensor copies it on the device (no wait)
            dtype = kwargs.get("dtype", args[0] if args else None)
            if not copies:
                return data if dtype is None else data.to(dtype)
            out = data.detach().clone() if dtype is None else data.detach().to(dtype, copy=True)
            return out.requires_grad_() if requires_grad else out
        if isinstance(data, SimulatedCudaTensor):
            data = data.inner.clone() if copies else data.inner
        out = original(data, *args, **kwargs)
        out = out.to(CUDA) if _is_cuda(device) else (out if device is None else out.to(device))
        return out.requires_grad_() if requires_grad else out
    return factory


def _counted_triton_run(run):
    """The Triton interpreter's launch, counted when it is given device tensors."""
    @functools.wraps(run)
    def counted(self, *args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, SimulatedCudaTensor)]
        if tensors:
            mode = SimulatedCuda.active
            mode.count_launch()
            if mode.capture is not None:  # a kernel may write any of its tensors
                mode.capture.before_write(tensors)
                mode.capture.ops.append(functools.partial(run, self, *args, **kwargs))
        return run(self, *args, **kwargs)
    return counted


def _triton_patches() -> list:
    if os.environ.get("TRITON_INTERPRET") != "1":
        return []
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return []
    import unittest.mock as mock

    return [mock.patch.object(InterpretedFunction, "run", _counted_triton_run(InterpretedFunction.run))]


class _Capture:
    """The device work recorded while a `SimulatedGraph` is captured, and the memory it must leave as it was."""

    def __init__(self):
        self.ops: list = []  # callables that run one recorded op or kernel again
        self.owned: set = set()  # storages made inside the capture (the graph's own memory)
        self.saved: dict = {}  # data_ptr -> (storage, its contents before the capture's first write)

    def before_write(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, SimulatedCudaTensor):
                storage = t.inner.untyped_storage()
                key = storage.data_ptr()
                if key not in self.owned and key not in self.saved:
                    self.saved[key] = (storage, storage.clone())

    def record_op(self, func, args, kwargs, result) -> None:
        """Records ``func`` to be run again, its new outputs copied into ``result``'s data by position (returns the
        schema does not mark as aliases, lists of tensors included, and not one sharing an input's storage, as
        ``_unsafe_view``'s does); written arguments are written again by the run itself and views see their base's
        data. A 0-dim CPU tensor argument is a value fixed at capture, as a kernel argument on CUDA."""
        inputs = {t.inner.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, SimulatedCudaTensor)}
        results = result if isinstance(result, tuple) else (result,)
        copies = []  # (return index, list index or None, the recorded output)
        for i, (r, spec) in enumerate(zip(results, func._schema.returns)):
            if spec.alias_info is not None:
                continue
            for j, t in enumerate(r) if isinstance(r, (list, tuple)) else ((None, r),):
                if isinstance(t, SimulatedCudaTensor) and t.inner.untyped_storage().data_ptr() not in inputs:
                    copies.append((i, j, t))
                    self.owned.add(t.inner.untyped_storage().data_ptr())
        fixed = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) and not isinstance(t, SimulatedCudaTensor)
                         and t.dim() == 0 else t, (args, kwargs))

        def again():
            out = func(*_unwrap(fixed[0]), **_unwrap(fixed[1]))
            outs = out if isinstance(out, tuple) else (out,)
            for i, j, t in copies:
                t.inner.copy_(outs[i] if j is None else outs[i][j])
        self.ops.append(again)

    def undo_writes(self) -> None:
        for storage, before in self.saved.values():
            storage.copy_(before)


class SimulatedGraph:
    """``torch.cuda.CUDAGraph`` on the simulated device. ``with torch.cuda.graph(g):`` runs the code once and
    records its device work; when the block ends the capture's writes to memory made before it are undone (a
    GPU runs nothing while it captures), so only ``replay()`` applies the step, each time on the tensors' current
    data. A host wait or a copy from the host inside the capture raises, as on CUDA."""

    def __init__(self, *args, **kwargs):
        self._ops: Optional[list] = None

    def replay(self) -> None:
        if self._ops is None:
            raise RuntimeError("simulated CUDA: replay of a CUDA graph that was not captured")
        SimulatedCuda.active.count_launch()  # cudaGraphLaunch
        for op in self._ops:  # aten ops on the CPU data, Triton launches through the mode (the interpreter's copies)
            op()

    def reset(self) -> None:
        self._ops = None


class _SimulatedStream:
    """``torch.cuda.Stream`` on the simulated device: one stream in all but name (the simulation has no queue)."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = CUDA


@contextlib.contextmanager
def _simulated_device_guard(device):
    """``torch.cuda.device``: the simulated device is the only one, always current."""
    yield


@contextlib.contextmanager
def _graph_capture(graph, pool=None, stream=None, capture_error_mode="global"):
    """``torch.cuda.graph`` on the simulated device (`SimulatedGraph`)."""
    mode = SimulatedCuda.active
    if mode.capture is not None:
        raise RuntimeError("simulated CUDA: a CUDA graph capture inside another")
    capture = mode.capture = _Capture()
    try:
        yield graph
    finally:
        mode.capture = None
        capture.undo_writes()
    graph._ops = capture.ops


@contextlib.contextmanager
def simulated_cuda() -> Iterator[SimulatedCuda]:
    """Simulate one CUDA device for the duration; yields the mode (``mode.syncs``: host synchronisations)."""
    import unittest.mock as mock

    mode = SimulatedCuda()
    patches = [
        mock.patch("torch.cuda._lazy_init", lambda: None),
        mock.patch("torch.cuda.is_available", lambda: True),
        mock.patch("torch.cuda.device_count", lambda: 1),
        mock.patch("torch.cuda.current_device", lambda: 0),
        mock.patch("torch.cuda.synchronize", lambda *a, **k: mode.capture is None or mode.count_sync()),
        mock.patch("torch.cuda.get_device_name", lambda *a, **k: "simulated CUDA device"),
        mock.patch("torch.cuda.is_bf16_supported", lambda *a, **k: True),
        mock.patch("torch.cuda.CUDAGraph", SimulatedGraph),
        mock.patch("torch.cuda.Stream", _SimulatedStream),
        mock.patch("torch.cuda.device", _simulated_device_guard),
        mock.patch("torch.cuda.graph", _graph_capture),
        mock.patch("torch.cuda.is_current_stream_capturing", lambda: mode.capture is not None),
        mock.patch("torch.tensor", _tensor_factory(torch.tensor)),
        mock.patch("torch.as_tensor", _tensor_factory(torch.as_tensor)),
        mock.patch.object(torch.Tensor, "to", _to),
        mock.patch.object(torch.Tensor, "cuda", lambda self, *a, non_blocking=False, **k: _to(self, CUDA,
                                                                                             non_blocking=non_blocking)),
        *_triton_patches(),
    ]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        previous = getattr(SimulatedCuda, "active", None)
        SimulatedCuda.active = mode
        try:
            with mode:
                yield mode
        finally:
            SimulatedCuda.active = previous
