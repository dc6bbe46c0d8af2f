"""smelt from Python: compile YAML models, load bundles, run sessions.

    import numpy as np, smelt
    bundle = smelt.compile("examples/mlp.yaml", target="cpu")
    session = bundle.session()
    y = session.run({"x": np.random.rand(8, 64).astype(np.float32)})["y"]

A `Bundle` is a compiled model (the `.smelt` file `smelt compile` writes, or
one compiled in memory by `smelt.compile`); a `Session` runs it on a device.
`Session.run` takes numpy arrays and any object with `__dlpack__` (torch,
CuPy, JAX): host memory is bound without a copy where it is C-contiguous,
and CUDA memory is bound as a device pointer on a CUDA session, taken
with the session's stream (`__dlpack__(stream=Session.cuda_stream)`), so
work the producer queued before the run is respected.  Outputs come back
as numpy arrays, or on a CUDA session whose inputs were CUDA tensors as
`CudaArray`s in device memory (`torch.from_dlpack(y)` takes one without a
copy), unless you pass arrays or tensors to write them into
(`outputs={name: tensor}`; CUDA tensors on a CUDA session, zero-copy).

Errors are `smelt.Error` subclasses chosen by the C API's status code
(`InvalidInputError`, `IOError`, `UnsupportedError`, `NoMemoryError`,
`InternalError`), carrying smelt's message, located (file:line:col) where
the fault is in a model file.

Compiling and running release the GIL.  A session may be used from one
thread at a time (a lock makes other threads wait); sessions on different
threads run in parallel.  See docs/python.md.
"""
from __future__ import annotations

import os
import re
import shutil
import threading
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _smelt

__all__ = [
    "compile", "load", "Bundle", "Session", "TensorInfo", "Specialisation", "CudaArray", "Error", "InvalidInputError",
    "IOError", "UnsupportedError", "NoMemoryError", "InternalError", "version", "__version__",
]


# ---------------------------------------------------------------- errors

class Error(Exception):
    """An error reported by smelt (a failed smelt_status).

    Attributes: ``message`` (smelt's text, e.g. "m.yaml:12:5: error: ..."),
    ``code`` (the smelt_status_code: 1 invalid input, 2 I/O, 3 unsupported,
    4 out of memory, 5 internal), and ``file``, ``line``, ``column`` where the
    message is located in a file (else None).
    """

    _LOCATED = re.compile(r"^(?P<file>[^\s:][^:\n]*):(?P<line>\d+):(?P<col>\d+): ")

    def __init__(self, message: str, code: Optional[int] = None):
        super().__init__(message)
        self.message: str = message
        self.code: Optional[int] = code
        m = self._LOCATED.match(message)
        self.file: Optional[str] = m.group("file") if m else None
        self.line: Optional[int] = int(m.group("line")) if m else None
        self.column: Optional[int] = int(m.group("col")) if m else None

    def __str__(self) -> str:
        return self.message


class InvalidInputError(Error, ValueError):
    """The model, bundle, file or argument is wrong (SMELT_INVALID_INPUT)."""


class IOError(Error, OSError):  # noqa: A001 (smelt.IOError, as the status code is named)
    """A file could not be read or written (SMELT_IO)."""

    def __init__(self, message: str, code: Optional[int] = None):
        Error.__init__(self, message, code)

    def __str__(self) -> str:
        return self.message


class UnsupportedError(Error):
    """Valid, but not available here: a device, a dtype, a feature (SMELT_UNSUPPORTED)."""


class NoMemoryError(Error, MemoryError):
    """Out of memory, on the host or the device (SMELT_NO_MEMORY)."""


class InternalError(Error):
    """A bug in smelt (SMELT_INTERNAL); please report it with the message."""


_smelt._set_error_classes([Error, InvalidInputError, IOError, UnsupportedError, NoMemoryError, InternalError])

version: str = _smelt.version()
__version__: str = version


# ---------------------------------------------------------------- dtypes

try:  # bf16 arrays, where ml_dtypes (from JAX) is installed; else raw uint16 bits
    import ml_dtypes as _ml_dtypes
    _BF16: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

_NUMPY_DTYPES: Dict[str, np.dtype] = {
    "f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "f64": np.dtype(np.float64),
    "i64": np.dtype(np.int64), "i32": np.dtype(np.int32), "i8": np.dtype(np.int8), "u8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_), "bf16": np.dtype(np.uint16),
}


def _numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a smelt dtype name (bf16: ml_dtypes.bfloat16, else uint16 bits)."""
    if name == "bf16" and _BF16 is not None:
        return _BF16
    return _NUMPY_DTYPES[name]


# ---------------------------------------------------------------- tensor descriptions

class TensorInfo(NamedTuple):
    """An input, output or state of a model.

    ``dtype`` is smelt's name ("f32", "f16", "bf16", "i32", ...); ``shape`` a
    tuple whose entries are None where the bundle's specialisations differ
    (``Bundle.inputs`` of a bundle compiled with several values of a dim).
    """
    name: str
    dtype: str
    shape: Tuple[Optional[int], ...]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype that holds this tensor (bf16: ml_dtypes.bfloat16 if installed, else uint16)."""
        return _numpy_dtype(self.dtype)


class Specialisation(NamedTuple):
    """One specialisation of a bundle: the dims it was compiled with ("seq=16", "" in a bundle
    of one), and its inputs and outputs with their shapes."""
    index: int
    dims: str
    inputs: Tuple[TensorInfo, ...]
    outputs: Tuple[TensorInfo, ...]


def _infos(raw: Iterable[Tuple[str, str, List[int]]]) -> Tuple[TensorInfo, ...]:
    return tuple(TensorInfo(n, d, tuple(None if x < 0 else int(x) for x in s)) for n, d, s in raw)


# ---------------------------------------------------------------- bundles

_DeviceLike = str


class Bundle:
    """A compiled model: every specialisation of it, its kernels and its constants.

    Made by :func:`compile` (in memory) or :func:`load` (a ``.smelt`` file).
    A bundle may serve several sessions at once.
    """

    def __init__(self, native: Any, source: str):
        self._b = native
        self._source = source
        self._specs: Optional[Tuple[Specialisation, ...]] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<smelt.Bundle {self._source!r}, {self.num_specialisations} specialisation(s)>"

    @property
    def path(self) -> Optional[str]:
        """The file the bundle was loaded from; None for one compiled in memory."""
        return self._b.path or None

    @property
    def num_specialisations(self) -> int:
        """How many specialisations the bundle holds (1 unless compiled with several values of a dim)."""
        return self._b.num_specialisations()

    @property
    def specialisations(self) -> Tuple[Specialisation, ...]:
        """Each specialisation with its dims and the exact shapes of its inputs and outputs."""
        with self._lock:
            if self._specs is None:
                self._specs = self._describe()
            return self._specs

    def _describe(self) -> Tuple[Specialisation, ...]:
        # from the bundle alone (smelt_bundle_input_info, ...): no session, so no device is needed
        return tuple(Specialisation(i, self._b.specialisation_dims(i), _infos(self._b.inputs(i)),
                                    _infos(self._b.outputs(i)))
                     for i in range(self.num_specialisations))

    def _merged(self, which: str) -> Tuple[TensorInfo, ...]:
        specs = self.specialisations
        first = getattr(specs[0], which)
        out = []
        for k, t in enumerate(first):
            shape = tuple(d if all(getattr(sp, which)[k].shape[j] == d for sp in specs) else None
                          for j, d in enumerate(t.shape))
            out.append(t._replace(shape=shape))
        return tuple(out)

    @property
    def inputs(self) -> Tuple[TensorInfo, ...]:
        """The model's inputs in order (name, dtype, shape); a dim in which the specialisations
        differ is None (see :attr:`specialisations` for each one's shapes)."""
        return self._merged("inputs")

    @property
    def outputs(self) -> Tuple[TensorInfo, ...]:
        """The model's outputs in order (name, dtype, shape), as :attr:`inputs`."""
        return self._merged("outputs")

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes the bundle as a ``.smelt`` file (what ``smelt run``/``smelt inspect`` and the C API open)."""
        data = self._b.data
        if data is not None:
            with open(path, "wb") as f:
                f.write(data)
        elif self.path is not None and os.path.abspath(self.path) != os.path.abspath(path):
            shutil.copyfile(self.path, path)

    def session(self, device: _DeviceLike = "cpu", threads: Optional[int] = None) -> "Session":
        """A session running this bundle on ``device`` ("cpu", "cuda" or "cuda:N"; a bundle compiled with
        ``tp=N`` takes a list of N GPUs, "cuda:0,cuda:1", one a rank, and the outputs are rank 0's).

        ``threads``: CPU worker threads (None: the count recorded at compile time, else one per core).
        A CUDA session compiles, with NVRTC, the kernels of a GPU the bundle has no cubin for.
        """
        if not isinstance(device, str):
            raise TypeError(f"device must be a string ('cpu', 'cuda', 'cuda:N'), not {type(device).__name__}")
        return Session(self, _smelt.session(self._b, device, 0 if threads is None else int(threads)), device)


def load(path: Union[str, os.PathLike]) -> Bundle:
    """Opens a ``.smelt`` bundle file (validated: a truncated or corrupted file raises an Error)."""
    p = os.fspath(path)
    return Bundle(_smelt.open(p), p)


_COMPILE_OPTIONS = {
    "passes": str, "cpu": str, "onchip_bytes": int, "threads": int, "allow_tf32": bool,
    "external_weights": bool, "no_cache": bool, "tp": int,
}


def _dims_string(dims: Optional[Mapping[str, Union[int, Sequence[int]]]]) -> Optional[str]:
    if not dims:
        return None
    parts = []
    for name, v in dims.items():
        values = [v] if isinstance(v, (int, np.integer)) else list(v)
        if not values or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in values):
            raise TypeError(f"dims[{name!r}] must be an int or a sequence of ints, not {v!r}")
        parts.append(f"{name}=" + ",".join(str(int(x)) for x in values))
    return ";".join(parts)


def compile(model_path: Union[str, os.PathLike], target: Union[str, Sequence[str]] = "cpu",
            dims: Optional[Mapping[str, Union[int, Sequence[int]]]] = None, dtype: Optional[str] = None,
            **options: Any) -> Bundle:
    """Compiles the YAML model at ``model_path`` into a bundle, in memory.

    target: "cpu", "cuda", or both ("cpu,cuda" or ["cpu", "cuda"]).
    dims: overrides of the model's dims, e.g. ``{"seq": 128}``; a sequence of
        values (``{"seq": [1, 16, 64]}``) makes one specialisation per value
        (per combination, for several dims), chosen at run time by the input shapes.
    dtype: the default element type ("f16", "bf16", ...) instead of the model's.
    options (as smelt_compile_options and the ``smelt compile`` flags):
        passes (str, the pass list), cpu (str, LLVM CPU name), onchip_bytes (int,
        fusion budget), threads (int, default thread count recorded in the bundle),
        allow_tf32 (bool), external_weights (bool), no_cache (bool), tp (int: tensor parallelism
        over that many ranks, each a thread of the session; on CUDA, give the
        session a device list such as "cuda:0,cuda:1").

    Raises an Error subclass with the located message (``model.yaml:LINE:COL: error: ...``)
    for a bad model.
    """
    for k, v in options.items():
        if k not in _COMPILE_OPTIONS:
            raise TypeError(f"smelt.compile: unknown option {k!r} (options: {', '.join(sorted(_COMPILE_OPTIONS))})")
        if not isinstance(v, _COMPILE_OPTIONS[k]):
            raise TypeError(f"smelt.compile: option {k!r} must be {_COMPILE_OPTIONS[k].__name__}, not {v!r}")
    targets = target if isinstance(target, str) else ",".join(target)
    path = os.fspath(model_path)
    native = _smelt.compile(path, targets, _dims_string(dims), dtype, options.get("passes"), options.get("cpu"),
                            int(options.get("onchip_bytes", 0)), int(options.get("threads", 0)),
                            bool(options.get("allow_tf32", False)), bool(options.get("external_weights", False)),
                            bool(options.get("no_cache", False)), int(options.get("tp", 1)))
    return Bundle(native, path)


# ---------------------------------------------------------------- sessions

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13


class CudaArray:
    """An output in CUDA device memory that smelt allocated: what a CUDA session's :meth:`Session.run`
    returns for outputs not given, when the inputs were CUDA tensors.

    A DLPack array: ``torch.from_dlpack(y)`` (or CuPy's, JAX's) takes it without a copy, and the memory
    is freed when the last of this object and the tensors made from it is gone.  The values are ready
    when ``run`` returns (a run waits for its stream), so a consumer on any stream may read them at once.
    ``shape``, ``dtype`` (smelt's name, "f32"), ``device`` ("cuda:0"), ``data_ptr`` (the device address,
    an int) and ``nbytes`` describe it.
    """

    __slots__ = ("_a", "shape", "dtype", "device", "data_ptr")

    def __init__(self, native: Any, shape: Tuple[int, ...], dtype: str, device: str, data_ptr: int):
        self._a = native
        self.shape: Tuple[int, ...] = shape
        self.dtype: str = dtype
        self.device: str = device
        self.data_ptr: int = data_ptr

    @property
    def nbytes(self) -> int:
        """Its size in bytes."""
        n = _numpy_dtype(self.dtype).itemsize
        for d in self.shape:
            n *= d
        return n

    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of the array (no copy; ``stream`` needs no wait: the data is ready)."""
        kw: Dict[str, Any] = {}
        if max_version is not None:
            kw["max_version"] = max_version
        if dl_device is not None:
            kw["dl_device"] = dl_device
        if copy is not None:
            kw["copy"] = copy
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(2, ordinal): CUDA memory of that GPU."""
        return tuple(self._a.__dlpack_device__())  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<smelt.CudaArray {self.dtype}{list(self.shape)} on {self.device} at {self.data_ptr:#x}>"


def _dlpack_device(x: Any) -> Optional[int]:
    try:
        return int(x.__dlpack_device__()[0])
    except (AttributeError, TypeError, ValueError):
        return None


class Session:
    """A bundle running on one device, with its own memory and state (made by :meth:`Bundle.session`).

    Use it from one thread at a time (other threads wait); make one session per thread to run in parallel.
    """

    def __init__(self, bundle: Bundle, native: Any, device: str):
        self._bundle = bundle
        self._s = native
        self._device = device
        self._cuda = device.startswith("cuda")
        self._stream: Optional[int] = native.cuda_stream() if self._cuda else None
        self._states = _infos(native.states())

    def __repr__(self) -> str:
        return f"<smelt.Session {self._bundle._source!r} on {self._device}>"

    @property
    def bundle(self) -> Bundle:
        """The bundle this session runs."""
        return self._bundle

    @property
    def device(self) -> str:
        """The device it runs on, as given ("cpu", "cuda:0", ...)."""
        return self._device

    @property
    def inputs(self) -> Tuple[TensorInfo, ...]:
        """The inputs of the chosen specialisation (dims None before one is chosen on a bundle of several)."""
        return _infos(self._s.inputs())

    @property
    def outputs(self) -> Tuple[TensorInfo, ...]:
        """The outputs of the chosen specialisation, as :attr:`inputs`."""
        return _infos(self._s.outputs())

    @property
    def cuda_stream(self) -> Optional[int]:
        """The CUstream (as an int) a CUDA session's runs are queued on; None on the CPU.

        :meth:`run` passes it to each CUDA tensor's ``__dlpack__(stream=...)``, so the producer makes it
        wait for the work queued on the producer's current stream.  A run returns when its GPU work is
        done, so its results need no wait on any stream.
        """
        return self._stream

    @property
    def specialisation(self) -> int:
        """The specialisation chosen by :meth:`select` or by the last run; -1 before any."""
        return self._s.specialisation()

    def select(self, index: int) -> None:
        """Pins specialisation ``index`` for every run from now on; -1 chooses by input shapes again."""
        self._s.select(int(index))

    # ---- state (a model's `state:`, e.g. a KV cache) ----

    @property
    def states(self) -> Tuple[TensorInfo, ...]:
        """The model's state tensors (name, dtype, shape): zero at creation, updated in place by every run,
        shared by every specialisation."""
        return self._states

    def _state(self, name: str) -> TensorInfo:
        for t in self._states:
            if t.name == name:
                return t
        have = ", ".join(t.name for t in self._states) or "none"
        raise InvalidInputError(f"the model has no state {name!r} (states: {have})", 1)

    def read_state(self, name: str) -> np.ndarray:
        """A copy of state ``name`` as a numpy array (host memory, also for a CUDA session)."""
        t = self._state(name)
        out = np.empty(t.shape, dtype=_numpy_dtype(t.dtype))
        self._s.read_state(name, out.view(np.uint16) if t.dtype == "bf16" else out)
        return out

    def write_state(self, name: str, array: Any) -> None:
        """Overwrites state ``name`` with ``array`` (numpy or a CPU DLPack tensor of its dtype and size)."""
        t = self._state(name)
        self._s.write_state(name, self._host_array(array, t))

    def reset_state(self) -> None:
        """Zeroes every state (a new sequence)."""
        self._s.reset_state()

    # ---- running ----

    @staticmethod
    def _host_array(x: Any, t: Optional[TensorInfo]) -> Any:
        """x as something the extension binds: a C-contiguous numpy array, or the DLPack object itself."""
        if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
            dev = _dlpack_device(x)
            if dev not in (_KDL_CPU, _KDL_CUDA_HOST):
                return x  # device memory: bound as it is (the extension checks device and contiguity)
            try:
                x = np.from_dlpack(x)
            except (TypeError, BufferError, RuntimeError, ValueError):
                return x  # a dtype numpy lacks (bf16): bound through DLPack directly
        if not isinstance(x, np.ndarray):
            x = np.asarray(x, dtype=_numpy_dtype(t.dtype) if t is not None else None)
        if t is not None and t.dtype == "bf16" and _BF16 is not None and x.dtype == _BF16:
            x = x.view(np.uint16)
        return np.ascontiguousarray(x)

    def _cuda_tensor(self, x: Any) -> Optional[Tuple[Any, bool]]:
        """A CUDA DLPack tensor for this CUDA session as (its DLPack capsule taken with the session's stream,
        whether the producer ignored the stream so the context must be synchronised); None for anything else."""
        if not self._cuda or isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__") or \
                _dlpack_device(x) != _KDL_CUDA:
            return None
        try:
            # the DLPack protocol: the producer makes smelt's stream wait for its (current stream's) work
            return x.__dlpack__(stream=self._stream), False
        except TypeError:  # a producer predating the stream argument
            return x.__dlpack__(), True

    def _choose(self, shapes: Mapping[str, Tuple[int, ...]]) -> Optional[Specialisation]:
        """The specialisation that takes these input shapes (the one the C API will run), or None."""
        specs = self._bundle.specialisations
        if len(specs) == 1:
            return specs[0]
        for sp in specs:
            if all(shapes.get(t.name, t.shape) == t.shape for t in sp.inputs):
                return sp
        return None

    def run(self, inputs: Mapping[str, Any],
            outputs: Optional[Union[Sequence[str], Mapping[str, Any]]] = None) -> Dict[str, Any]:
        """Runs the model once and returns its outputs by name.

        inputs: {name: array}; numpy arrays, anything with ``__dlpack__`` (torch, CuPy, JAX), or array-likes.
            Host memory is bound without a copy when C-contiguous (else copied once); on a CUDA session,
            CUDA tensors are bound as device pointers (they must be C-contiguous), taken with
            ``__dlpack__(stream=self.cuda_stream)`` so that the session's stream waits for the work their
            producer queued on its current stream (a producer without the stream argument: the current
            CUDA context is synchronised instead). The dtype must be the model's (no silent casts); the
            shapes pick the specialisation.
        outputs: None (every output, as new arrays), a list of names (only those), or
            {name: array or tensor} to write those outputs into (zero-copy; CUDA tensors on a CUDA session).
            Outputs not named are still computed, into arrays that are dropped. New arrays are numpy
            arrays, except on a CUDA session given any CUDA tensor input: then :class:`CudaArray`s in
            device memory (zero-copy into ``torch.from_dlpack``).

        The run is synchronous: when it returns, the outputs hold their values (also in device memory).
        """
        if not isinstance(inputs, Mapping):
            raise TypeError("Session.run: inputs must be a dict {name: array}")
        infos = {t.name: t for t in self._bundle.inputs}
        bound = {}
        shapes: Dict[str, Tuple[int, ...]] = {}
        sync = device_inputs = False
        for name, x in inputs.items():
            t = infos.get(name)
            if t is None:
                have = ", ".join(infos) or "none"
                raise InvalidInputError(f"the model has no input {name!r} (inputs: {have})", 1)
            dev = self._cuda_tensor(x)
            if dev is not None:
                bound[name], must_sync = dev
                sync |= must_sync
                device_inputs = True
                if hasattr(x, "shape"):
                    shapes[name] = tuple(int(d) for d in x.shape)
            else:
                bound[name] = self._host_array(x, t)
                if hasattr(bound[name], "shape"):
                    shapes[name] = tuple(int(d) for d in bound[name].shape)
        # every input, every run: the C API keeps a binding from one run to the next, and the memory
        # of an earlier run's array may be gone
        missing = [n for n in infos if n not in bound]
        if missing:
            raise InvalidInputError("Session.run: missing input(s) " + ", ".join(repr(n) for n in missing) +
                                    " (every input must be given at every run)", 1)
        given: Dict[str, Any] = {}
        if outputs is None:
            wanted = None
        elif isinstance(outputs, Mapping):
            given = dict(outputs)
            wanted = list(given)
        elif isinstance(outputs, str):
            raise TypeError("Session.run: outputs must be a list of names or a dict, not a string")
        else:
            wanted = list(outputs)
        sp = self._choose(shapes)
        out_infos = {t.name: t for t in (sp.outputs if sp is not None else self._bundle.outputs)}
        for name in (wanted or []):
            if name not in out_infos:
                have = ", ".join(out_infos) or "none"
                raise InvalidInputError(f"the model has no output {name!r} (outputs: {have})", 1)
        results: Dict[str, Any] = {}
        binds = []
        for name, t in (out_infos.items() if sp is not None else ()):
            if name in given:
                y = given[name]
                dev = self._cuda_tensor(y)
                if dev is not None:
                    binds.append((name, dev[0]))
                    sync |= dev[1]
                else:
                    binds.append((name, y if hasattr(y, "__dlpack__") and not isinstance(y, np.ndarray) else
                                  (y.view(np.uint16) if t.dtype == "bf16" and _BF16 is not None and y.dtype == _BF16
                                   else y)))
                results[name] = y
            elif device_inputs:
                native, ptr = self._s.alloc_cuda(list(t.shape), t.dtype)
                binds.append((name, native))
                results[name] = CudaArray(native, tuple(t.shape), t.dtype, self._cuda_device_name(), ptr)
            else:
                y = np.empty(t.shape, dtype=_numpy_dtype(t.dtype))
                binds.append((name, y.view(np.uint16) if t.dtype == "bf16" else y))
                results[name] = y
        if sp is None:
            # No specialisation takes these shapes together: binding them raises the C API's message
            # for an input no specialisation takes; else say so here (nothing runs, so no output
            # memory of an earlier run is written).
            self._s.run(list(bound.items()), [], False, False)
            shapes = ", ".join(f"{n} {list(getattr(x, 'shape', ()))}" for n, x in bound.items())
            dims = ", ".join(other.dims for other in self._bundle.specialisations)
            raise InvalidInputError(f"no specialisation takes the inputs {shapes} together; the bundle has "
                                    f"{dims}", 1)
        self._s.run(list(bound.items()), binds, True, sync)
        if wanted is None:
            return results
        return {name: results[name] for name in wanted}

    def _cuda_device_name(self) -> str:
        d = self._device.split(",")[0]  # tensor-parallel ranks: the outputs are rank 0's
        return d if ":" in d else d + ":0"

    def __call__(self, inputs: Mapping[str, Any], **kw: Any) -> Dict[str, Any]:
        """The same as :meth:`run`."""
        return self.run(inputs, **kw)
