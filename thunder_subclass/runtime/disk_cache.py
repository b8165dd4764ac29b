"""Stage 2 (per call), the on-disk cache of a ``thunder_subclass.jit`` function: a restarted process reuses the
compilation of an earlier one.

In: a cache miss of a compiled function (no entry of its in-memory cache accepts the call) under thunder's
constant-values cache, in a process where the disk cache is on (the default, as torch.compile's caches are; off with
``thunder_subclass.config.disk_cache = False``, ``THUNDER_SUBCLASS_DISK_CACHE=0`` in the environment, or
``thunder_subclass.jit(fn, disk_cache=False)`` for one function). What happens: before tracing, the entries
stored on disk under the call's *key* are tried, newest first; one that is intact, whose recorded source files are
unchanged and whose prologue (the same guards as the in-memory entry's) accepts the call becomes the function's new
cache entry, and nothing is traced. Otherwise the call traces as before, and the entry built is written to disk if it
can be described there. Out: a thunder cache entry (``CacheEntry``), loaded or new.

What an entry holds (JSON, one file): the Python source of the final prologue, computation and epilogue traces (what
``TraceCtx.python_callable`` executes), and a description of the names their source uses (``python_ctx``): modules by
name; classes, functions and enums by module and qualified name (with the module's file); torch ops by name; torch
dtypes, devices, sizes and literals; the plugin's per-class symbols (``flatten_<Cls>``, ``unflatten_<Cls>``, ...) by
the factory that makes them and its arguments; the plugin's fused prologue checks by their generated source and
constants. A value that cannot be named so (an object known only by its identity, a closure, a compiled fusion region) makes
the entry not storable: the call compiles as without the disk cache (``disk_cache_stats()["not_storable"]``).
Entries with a backward (a call that needs gradients) are stored with the backward's source; its
``tangents.BackwardVariants`` by what the run-time hooks read (``disk_state``: the gradient kind each output expects,
subclass outputs too), without the joint trace; a loaded one (``tangents.StoredBackwardVariants``) given gradients of
another kind than the outputs' traces the call again in-process for the joint trace those need. Not stored:
entries of a jit with symbolic values, nor any while grad rules, executor implementations or aten symbols are
registered.

The key (a directory) is a hash of: the format, Python, torch, thunder and other imported libraries' versions
(torchao, transformers, ...), the content of the plugin's own source files, the compiled function (module class or
function: module, qualified name, file and its content, and the values the function holds: closure, defaults, bound
object; ``_bound_values``), the jit's options (executors, transforms, cache option,
compile options), grad mode, default dtype and device, and the CUDA devices. Each entry also lists the files whose
code the interpreter ran while tracing (every code object ``thunder``'s interpreter decoded) and the files of the
modules its names come from, each with a SHA-256 of its content, checked when the entry is loaded: an edited function
anywhere in the traced code is a miss. Guards on values (shapes, dtypes, subclass types and flatten contexts, module
attributes, globals read) are the prologue's own, run on every candidate entry.

Safety: a file is written to a temporary name in its directory and renamed into place (``os.replace``), so readers
see a whole file or none; a file carries the SHA-256 of its payload, and one that does not parse or match it is
corrupted: it is removed, with a :class:`~thunder_subclass.errors.DiskCacheWarning`, and the call compiles. The cache
is private to its user (``thunder_subclass.runtime.disk_trust``): directories are made ``0700`` and entries ``0600``,
and an entry owned by another user, or under a directory others can write, is never read (a ``DiskCacheWarning`` says
why). An entry whose recorded files changed, or whose names no longer resolve to the same kind of object, is stale: it
is removed silently. An entry's source runs only after these checks, and its prologue guards the call as any entry's.

Location: ``thunder_subclass.config.disk_cache_dir``, else ``$THUNDER_SUBCLASS_CACHE_DIR``, else
``~/.cache/thunder_subclass``; under it ``v3/<key>/<entry>.json``. Size: at most
``thunder_subclass.config.disk_cache_size_limit`` bytes (default 256 MiB); after a write past it the least recently
used entries (file modification time, refreshed at each load) are removed.

Owner of state: the per-function :class:`DiskCache` lives on the jit's compile data (freed with it); the statistics
and the file-hash memo are process-wide (:func:`disk_cache_stats`, :func:`reset_disk_cache_stats`).

Example (a second process running the same script loads what the first stored)::

    >>> import tempfile, torch, thunder_subclass
    >>> thunder_subclass.config.disk_cache_dir = tempfile.mkdtemp()   # (on by default)
    >>> model = torch.nn.Linear(4, 2)
    >>> with torch.no_grad():
    ...     _ = thunder_subclass.jit(model)(torch.ones(3, 4))   # traces, stores
    ...     _ = thunder_subclass.jit(model)(torch.ones(3, 4))   # loads (as another process would)
    >>> thunder_subclass.disk_cache_stats()["hits"]
    1
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import json
import os
import pathlib
import sys
import tempfile
import threading
import types
import warnings
from typing import Any

import torch

from thunder_subclass import _thunder_internals, rules
from thunder_subclass.frontend import aten_symbols
from thunder_subclass.runtime import eager_calls
from thunder_subclass.runtime.disk_trust import make_private_dirs, untrusted_reason
from thunder_subclass.errors import DiskCacheWarning
from thunder_subclass.guards.prologue import FusedChecks
from thunder_subclass.frontend.subclass_symbols import FlattenContext

__all__ = ["DiskCache", "disk_cache_stats", "reset_disk_cache_stats", "default_cache_dir", "FORMAT",
           "DEFAULT_SIZE_LIMIT"]

# 2: functions named with their code; 3: no entry whose backward runs an eager call (2 stored some); 4: the plugin's
# modules moved into folders (issue 42), training entries with subclass outputs (their gradient kinds) stored
FORMAT = 4
DEFAULT_SIZE_LIMIT = 256 * 2**20
MAX_ENTRIES_TRIED = 8  # entries of one key tried at a miss (newest first)
_SUFFIX = ".json"

_STATS_KEYS = ("hits", "misses", "stores", "not_storable", "stale", "corrupted", "rejected", "untrusted")
_stats = dict.fromkeys(_STATS_KEYS, 0)
_last_not_storable: list[str] = []  # why the last entries were not stored (newest last, a few)
_warned_untrusted: set[str] = set()  # paths an untrusted-entry warning was given for (once per path and process)
_lock = threading.Lock()


def disk_cache_stats() -> dict:
    """Process-wide counts of the on-disk cache: ``hits`` (misses in memory answered by an entry from disk),
    ``misses`` (nothing on disk accepted the call: it traced), ``stores`` (entries written), ``not_storable``
    (entries that could not be described on disk; ``"why_not_storable"`` lists the last reasons), ``stale`` (entries
    removed because a file they depend on changed or a name no longer resolves), ``corrupted`` (unreadable files
    removed), ``rejected`` (intact entries whose prologue did not accept the call: another shape, type, ...),
    ``untrusted`` (entries or directories not read: owned by another user or writable by others)."""
    with _lock:
        out = dict(_stats)
        out["why_not_storable"] = list(_last_not_storable)
    return out


def reset_disk_cache_stats() -> None:
    with _lock:
        for k in _STATS_KEYS:
            _stats[k] = 0
        _last_not_storable.clear()
        _warned_untrusted.clear()


def _count(name: str, n: int = 1) -> None:
    with _lock:
        _stats[name] += n


def default_cache_dir() -> pathlib.Path:
    """``$THUNDER_SUBCLASS_CACHE_DIR``, else ``~/.cache/thunder_subclass`` (``$XDG_CACHE_HOME`` if set)."""
    env = os.environ.get("THUNDER_SUBCLASS_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "thunder_subclass"


class NotStorable(Exception):
    """An entry (or a value in it) that cannot be described on disk."""


class _Stale(Exception):
    """An entry that no longer describes this process's code (a file changed, a name does not resolve)."""


# ---------------------------------------------------------------------------------------------------------------
# File hashes
# ---------------------------------------------------------------------------------------------------------------

_file_hashes: dict[str, tuple[int, int, str]] = {}  # path -> (mtime_ns, size, sha256), process-wide memo


def _file_hash(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    memo = _file_hashes.get(path)
    if memo is not None and memo[0] == st.st_mtime_ns and memo[1] == st.st_size:
        return memo[2]
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
    import time

    if time.time_ns() - st.st_mtime_ns > 2_000_000_000:  # a file changed within the last 2 s may change again
        _file_hashes[path] = (st.st_mtime_ns, st.st_size, digest)  # unseen by its mtime (coarse clocks): not kept
    return digest


def _is_generated_code(filename: str) -> bool:
    """Code that thunder or the plugin generated from traces (its own source is what is stored and checked), or
    Python's frozen modules (fixed by the Python version in the key)."""
    return filename.startswith(("thunder.", "<thunder_subclass", "<frozen "))


_package_hash: str | None = None


def _plugin_source_files() -> tuple[pathlib.Path, list[pathlib.Path]]:
    """The package's directory (this module is in its ``runtime/``) and every source file below it."""
    root = pathlib.Path(__file__).resolve().parent.parent
    return root, sorted(root.rglob("*.py"))


def _plugin_source_hash() -> str:
    """SHA-256 of the plugin's own source files (its behaviour shapes every trace; its version string does not change
    with every edit)."""
    global _package_hash
    if _package_hash is None:
        root, paths = _plugin_source_files()
        h = hashlib.sha256()
        for path in paths:
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
        _package_hash = h.hexdigest()
    return _package_hash


_VERSIONED = ("torch", "thunder", "torchao", "transformers", "numpy", "triton", "nvfuser", "nvfuser_direct")


def _library_versions() -> dict:
    out = {"python": sys.version, "plugin": _plugin_source_hash()}
    for name in _VERSIONED:
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = str(getattr(mod, "__version__", "?"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Values: JSON-able descriptions that name things stably across processes
# ---------------------------------------------------------------------------------------------------------------

_SKIP_FILE_MODULES = ("torch", "thunder", "thunder_subclass", "builtins", "_operator", "operator", "math", "typing",
                      "collections", "functools", "abc", "enum", "types")


class _Encoder:
    """Describes values as JSON; records the files of the modules its references name (``files``)."""

    def __init__(self):
        self.files: dict[str, str] = {}

    def ref(self, obj: Any) -> list:
        """``["ref", module, qualname, file]``: ``obj`` reached again by importing ``module`` and following the
        qualified name; only when that gives ``obj`` itself now."""
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
            raise NotStorable(f"{obj!r} has no importable name")
        try:
            found = _resolve(module, qualname)
        except Exception:  # noqa: BLE001 - any failure to resolve: not nameable
            found = None
        if found is not obj:
            raise NotStorable(f"{module}.{qualname} does not name {obj!r}")
        file = getattr(sys.modules.get(module), "__file__", None)
        if file and module.split(".")[0] not in _SKIP_FILE_MODULES:
            digest = _file_hash(file)
            if digest is None:
                raise NotStorable(f"the file of module {module} cannot be read")
            self.files[file] = digest
        if isinstance(obj, types.FunctionType):  # its code too: a name may be rebound to another function later
            return ["ref", module, qualname, file, _code_digest(obj.__code__)]
        return ["ref", module, qualname, file]

    def encode(self, v: Any) -> Any:
        t = type(v)
        if v is None or t is bool or t is int or t is str:
            return v
        if t is float:
            return ["f", repr(v)]
        if t is complex:
            return ["c", repr(v.real), repr(v.imag)]
        if t is tuple:
            return ["t", [self.encode(x) for x in v]]
        if t is list:
            return ["l", [self.encode(x) for x in v]]
        if t is dict:
            return ["d", [[self.encode(k), self.encode(x)] for k, x in v.items()]]
        if t is set or t is frozenset:
            items = [self.encode(x) for x in v]
            return ["set" if t is set else "fset", sorted(items, key=json.dumps)]
        if t is torch.Size:
            return ["size", [int(x) for x in v]]
        if t is torch.dtype:
            return ["dtype", str(v).removeprefix("torch.")]
        if t is torch.device:
            return ["device", str(v)]
        if t is torch.memory_format or t is torch.layout:
            return [t.__name__, str(v).removeprefix("torch.")]
        if t is types.ModuleType:
            return ["module", v.__name__]
        if isinstance(v, torch._ops.OpOverload):
            return ["op", v._schema.name, v._overloadname]
        if isinstance(v, torch._ops.OpOverloadPacket):
            return ["oppacket", v._qualified_op_name]
        if isinstance(v, enum.Enum):
            return ["enum", self.ref(type(v)), v.name]
        if t is FlattenContext:
            return ["flatten_ctx", self.encode(v.value)]
        if t is FusedChecks:
            return ["fused_checks", self.encode(v.state())]
        if callable(getattr(t, "disk_state", None)) and callable(getattr(t, "from_disk_state", None)):
            try:  # the plugin's own value types and guards (thunder_subclass.guards.Guard)
                state = v.disk_state()
            except ValueError as e:
                raise NotStorable(str(e)) from None
            if state is not NotImplemented:
                return ["object", self.ref(t), self.encode(state)]
        if isinstance(v, type) and v.__module__ == "builtins" and _types_name(v) is not None:
            return ["types", _types_name(v)]  # function, method, ...: named by the types module only
        if callable(v) or isinstance(v, type):
            origin = _thunder_internals.symbol_origin(v)
            if origin is not None:
                factory, args = origin
                return ["symbol", self.ref(factory), self.encode(tuple(args))]
            return self.ref(v)
        thunder_dtype = _thunder_dtype_name(v)
        if thunder_dtype is not None:
            return ["thunder_dtype", thunder_dtype]
        return self.pickled(v)

    def pickled(self, v: Any) -> list:
        """``["pickle", base64]`` for a value with value equality (its type defines ``__eq__``) whose pickled copy
        is of the same type and equal to it (e.g. the copy of a config object a prologue compares calls with); the
        files of the modules of the classes pickled are recorded."""
        import base64
        import io
        import pickle

        t = type(v)
        what = f"a value of type {t.__module__}.{t.__qualname__} ({_short(v)})"
        if getattr(t, "__eq__", object.__eq__) is object.__eq__:
            raise NotStorable(f"{what}, known by identity only")
        encoder = self
        buffer = io.BytesIO()

        class Pickler(pickle.Pickler):
            def reducer_override(self, obj):
                for cls in (obj, type(obj)) if isinstance(obj, type) else (type(obj),):
                    if cls.__module__ not in ("builtins",):
                        try:
                            encoder.ref(cls)
                        except NotStorable:
                            pass
                return NotImplemented

        try:
            Pickler(buffer, protocol=4).dump(v)
            data = buffer.getvalue()
            copy = pickle.loads(data)
            same = type(copy) is t and bool(copy == v)
        except Exception as e:  # noqa: BLE001 - not picklable or not comparable
            raise NotStorable(f"{what}, not picklable ({type(e).__name__})") from None
        if not same:
            raise NotStorable(f"{what}, whose pickled copy is not equal to it")
        return ["pickle", base64.b64encode(data).decode()]


def _short(v: Any) -> str:
    try:
        text = repr(v)
    except Exception:  # noqa: BLE001
        text = object.__repr__(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _types_name(cls: type) -> str | None:
    """The name in the ``types`` module of a builtin class that ``builtins`` does not hold (``types.FunctionType``)."""
    import builtins

    if getattr(builtins, cls.__name__, None) is cls:
        return None
    for name, value in vars(types).items():
        if value is cls:
            return name
    return None


def _thunder_dtype_name(v: Any) -> str | None:
    import thunder.core.dtypes as dtypes

    if isinstance(v, dtypes.dtype):
        for name, d in vars(dtypes).items():
            if d is v:
                return name
    return None


def _resolve(module: str, qualname: str) -> Any:
    obj = sys.modules.get(module) or importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _decode(x: Any) -> Any:
    if not isinstance(x, list):
        return x
    tag = x[0]
    if tag == "f":
        return float(x[1])
    if tag == "c":
        return complex(float(x[1]), float(x[2]))
    if tag == "t":
        return tuple(_decode(y) for y in x[1])
    if tag == "l":
        return [_decode(y) for y in x[1]]
    if tag == "d":
        return {_decode(k): _decode(v) for k, v in x[1]}
    if tag == "set":
        return {_decode(y) for y in x[1]}
    if tag == "fset":
        return frozenset(_decode(y) for y in x[1])
    if tag == "size":
        return torch.Size(x[1])
    if tag in ("dtype", "memory_format", "layout"):
        v = getattr(torch, x[1])
        if type(v).__name__ != ("dtype" if tag == "dtype" else tag):
            raise _Stale(f"torch.{x[1]} is not a {tag}")
        return v
    if tag == "device":
        return torch.device(x[1])
    if tag == "module":
        return sys.modules.get(x[1]) or importlib.import_module(x[1])
    if tag == "op":
        namespace, _, name = x[1].partition("::")
        if namespace == "thunder_subclass":  # the plugin's own operators are registered on first use
            _thunder_internals.register_plugin_operators()
        return getattr(getattr(getattr(torch.ops, namespace), name), x[2])
    if tag == "oppacket":
        namespace, _, name = x[1].partition("::")
        return getattr(getattr(torch.ops, namespace), name)
    if tag == "enum":
        return getattr(_decode(x[1]), x[2])
    if tag == "flatten_ctx":
        return FlattenContext(_decode(x[1]))
    if tag == "pickle":
        import base64
        import pickle

        return pickle.loads(base64.b64decode(x[1]))
    if tag == "object":
        return _decode(x[1]).from_disk_state(_decode(x[2]))
    if tag == "fused_checks":
        return FusedChecks.from_state(_decode(x[1]))
    if tag == "ref":
        _, module, qualname, file, *code = x
        found = _resolve(module, qualname)
        if file is not None and getattr(sys.modules.get(module), "__file__", None) != file:
            raise _Stale(f"module {module} is not {file} in this process")
        if code and (not isinstance(found, types.FunctionType) or _code_digest(found.__code__) != code[0]):
            raise _Stale(f"{module}.{qualname} is another function in this process (rebound, monkeypatched)")
        return found
    if tag == "symbol":
        factory, args = _decode(x[1]), _decode(x[2])
        sym = factory(*args)
        fn = _thunder_internals.symbol_implementation(sym)
        if fn is None:
            raise _Stale(f"{x[1]} made a symbol without a recorded implementation")
        return fn
    if tag == "executor_op":
        fn = _thunder_internals.operator_implementation(x[1], x[2])
        if fn is None:
            raise _Stale(f"executor {x[1]} has no operator {x[2]}")
        return fn
    if tag == "types":
        return getattr(types, x[1])
    if tag == "thunder_dtype":
        import thunder.core.dtypes as dtypes

        return getattr(dtypes, x[1])
    raise _Stale(f"unknown tag {tag!r}")


# ---------------------------------------------------------------------------------------------------------------
# Traces of a loaded entry
# ---------------------------------------------------------------------------------------------------------------


class LoadedTrace:
    """A trace of an entry loaded from disk: the program it ran (``python()``, printing), not its bound symbols (the
    interpreter did not run in this process). What ``thunder.last_traces`` shows for such an entry."""

    def __init__(self, source: str, path: str):
        self.source, self.path = source, path
        self.bound_symbols: list = []

    def python(self, **kwargs) -> str:
        return self.source

    def __str__(self) -> str:
        return f"# Loaded from the thunder_subclass disk cache ({self.path})\n{self.source}"

    __repr__ = __str__


# ---------------------------------------------------------------------------------------------------------------
# The cache of one compiled function
# ---------------------------------------------------------------------------------------------------------------

_TRACES = ("prologue", "computation", "epilogue")
_GLOBALS_SET_BY_THUNDER = ("__function_obj", "thunder", "__global_dicts")


class DiskCache:
    """The on-disk cache of one ``thunder_subclass.jit`` function (see the module docstring); handed to the per-call
    path as ``_thunder_internals.CallPort.disk_cache`` (``cache_policy.compiled_call``), which calls :meth:`load` at
    a miss and :meth:`store` after a new trace."""

    def __init__(self, root: str | os.PathLike, size_limit: int | None):
        self.base = pathlib.Path(root)  # the configured directory: trusted from here down (disk_trust)
        self.root = self.base / f"v{FORMAT}"
        self.size_limit = size_limit

    # -- keys ----------------------------------------------------------------------------------------------------

    def _key(self, cd, args, kwargs) -> tuple[str, dict]:
        enc = _Encoder()
        fn = cd.fn
        if getattr(cd, "executor_lookasides", None):
            raise NotStorable("the jit has executor lookasides")
        if isinstance(fn, torch.nn.Module):
            target = ["module", enc.ref(type(fn))]
        else:
            code = getattr(fn, "__code__", None)
            if code is None:
                raise NotStorable(f"the compiled callable {_short(fn)} is neither a module nor a Python function")
            digest = _file_hash(code.co_filename)
            if digest is None:
                raise NotStorable(f"the file of {getattr(fn, '__qualname__', fn)} ({code.co_filename}) cannot be read")
            # the code itself too: two lambdas on one line share file, line and name
            target = ["function", getattr(fn, "__module__", None), getattr(fn, "__qualname__", None),
                      code.co_filename, code.co_firstlineno, digest, _code_digest(code), _bound_values(enc, fn)]
        # devices: their number, and their names once CUDA is initialized (asking names would initialize it)
        cuda = [torch.version.cuda, torch.cuda.device_count() if torch.cuda.is_available() else 0]
        if torch.cuda.is_initialized():
            cuda += [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        parts = {
            "format": FORMAT,
            "versions": _library_versions(),
            "target": target,
            "target_files": enc.files,
            # thunder's per-jit executor for executor lookasides is named by its id: named by kind here (a jit with
            # lookasides of its own is not stored: _describe finds their functions unnameable)
            "executors": ["__ad_hoc_executor" if ex.name.startswith("__ad_hoc_executor") else ex.name
                          for ex in cd.executors_list],
            "transforms": [f"{type(t).__module__}.{type(t).__qualname__}" for t in (cd.transforms or ())],
            "cache_option": str(cd.cache_option),
            "compile_options": sorted((k, repr(v)) for k, v in cd.compile_options.items()),
            "sharp_edges": str(cd.sharp_edges),
            "disable_torch_autograd": bool(cd.disable_torch_autograd_support),
            "langctx": getattr(cd.langctx, "name", None) or type(cd.langctx).__qualname__,
            "grad": torch.is_grad_enabled(),
            "default_dtype": str(torch.get_default_dtype()),
            "default_device": str(torch.get_default_device()),
            "cuda": cuda,
        }
        text = json.dumps(parts, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:32], json.loads(text)

    @staticmethod
    def _usable() -> bool:
        return not rules.has_registrations() and not aten_symbols.has_registered_aten_symbols()

    # -- load ----------------------------------------------------------------------------------------------------

    def load(self, cd, cs, args, kwargs):
        """A cache entry from disk whose prologue accepts the call, or None (never raises)."""
        try:
            if not self._usable():
                return None
            key, parts = self._key(cd, args, kwargs)
        except Exception:  # noqa: BLE001 - not storable, so nothing to load
            return None
        directory = self.root / key
        if self._untrusted(directory):
            _count("misses")
            return None
        try:
            paths = sorted(directory.glob(f"*{_SUFFIX}"), key=_mtime, reverse=True)[:MAX_ENTRIES_TRIED]
        except OSError:
            paths = []
        for path in paths:
            if self._untrusted(path):
                continue
            entry = self._try(path, parts, cd, cs, args, kwargs)
            if entry is not None:
                _count("hits")
                try:
                    os.utime(path)  # recently used, for eviction
                except OSError:
                    pass
                return entry
        _count("misses")
        return None

    def _try(self, path: pathlib.Path, parts: dict, cd, cs, args, kwargs):
        from thunder.core.compile_data import compile_data_and_stats

        try:
            text = path.read_text()
        except OSError:  # removed meanwhile (another process evicted it)
            return None
        try:
            wrapper = json.loads(text)
            payload_text = wrapper["payload"]
            if hashlib.sha256(payload_text.encode()).hexdigest() != wrapper["sha256"]:
                raise ValueError("checksum mismatch")
            payload = json.loads(payload_text)
            if payload["format"] != FORMAT:
                raise ValueError(f"format {payload['format']}")
        except Exception as e:  # noqa: BLE001 - whatever is wrong with the file
            self._corrupted(path, e)
            return None
        if payload["key"] != parts:  # a hash collision or a hand-copied file: not this function's
            return None
        try:
            for file, digest in payload["files"].items():
                if _file_hash(file) != digest:
                    raise _Stale(f"{file} changed")
            with compile_data_and_stats(cd, cs):  # (the values stored as "the compiled function" are cd's)
                entry = self._build(payload, cd, str(path))
        except _Stale:
            _count("stale")
            _remove(path)
            return None
        except Exception:  # noqa: BLE001 - a name that resolves to something else, a module that moved
            _count("stale")
            _remove(path)
            return None
        try:
            with compile_data_and_stats(cd, cs):
                entry.prologue_fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the entry's guards reject the call (another shape, type, value)
            _count("rejected")
            return None
        return entry

    def _build(self, payload: dict, cd, path: str):
        import thunder
        from thunder.core import baseutils

        fns, traces = dict.fromkeys(_TRACES + ("backward",)), dict.fromkeys(_TRACES + ("backward",), [])
        for name, t in payload["traces"].items():
            ctx = {k: _decode(v) for k, v in t["ctx"].items()}
            if t["function_obj"]:
                ctx["__function_obj"] = cd.fn
            ctx["thunder"] = thunder
            fn = baseutils.build_callable(t["name"], python_str=t["source"], file_name=f"thunder.{t['name']}", ctx=ctx)
            if name == "prologue":  # as TraceCtx.python_callable: no reference from the prologue to itself
                fn.__globals__.pop(t["name"], None)
            fns[name] = fn
            traces[name] = [LoadedTrace(t["source"], path)]
        return thunder.CacheEntry(fns["prologue"], traces["prologue"], fns["computation"], traces["computation"],
                                  fns["epilogue"], traces["epilogue"], fns["backward"], traces["backward"],
                                  payload["return_none_instead_of_grads"])

    def _untrusted(self, path: pathlib.Path) -> bool:
        """Whether ``path`` may have been written by another user (``disk_trust.untrusted_reason``): it is then never
        read (counted as ``untrusted``, with one :class:`DiskCacheWarning` per path and process)."""
        reason = untrusted_reason(path, self.base)
        if reason is None:
            return False
        _count("untrusted")
        with _lock:
            first = str(path) not in _warned_untrusted
            _warned_untrusted.add(str(path))
        if first:
            warnings.warn(DiskCacheWarning(
                f"thunder_subclass: the disk cache entries under {path} are not used: {reason}. An entry is Python "
                "code that is executed: the cache directory must be owned by you and writable by you only (chmod "
                "700, or delete it: thunder_subclass makes it anew); the function is compiled instead."),
                stacklevel=3)
        return True

    def _corrupted(self, path: pathlib.Path, e: Exception) -> None:
        _count("corrupted")
        _remove(path)
        warnings.warn(DiskCacheWarning(
            f"thunder_subclass: the disk cache entry {path} is unreadable ({type(e).__name__}: {e}); it was "
            "removed and the function is compiled anew."), stacklevel=2)

    # -- store ---------------------------------------------------------------------------------------------------

    def store(self, cd, cs, args, kwargs, entry, codes) -> None:
        """Write ``entry`` (just built for this call) to disk if it can be described there (never raises)."""
        try:
            if not self._usable():
                raise NotStorable("grad rules, executor implementations or aten symbols are registered")
            key, parts = self._key(cd, args, kwargs)
            payload = self._describe(cd, entry, codes)
            payload["key"] = parts
        except NotStorable as e:
            self._not_storable(str(e))
            return
        except Exception as e:  # noqa: BLE001 - a failure to describe is never the user's error
            self._not_storable(f"{type(e).__name__}: {e}")
            return
        try:
            self._write(key, payload)
            _count("stores")
        except NotStorable as e:
            self._not_storable(str(e))
        except OSError as e:
            self._not_storable(f"cannot write to {self.root}: {e}")

    @staticmethod
    def _not_storable(reason: str) -> None:
        with _lock:
            _stats["not_storable"] += 1
            _last_not_storable.append(reason)
            del _last_not_storable[:-8]

    def _describe(self, cd, entry, codes) -> dict:
        if any(eager_calls.holds_eager_call(trcs[-1]) for trcs in (entry.computation_traces, entry.backward_traces)
               if trcs):
            raise NotStorable("the computation calls a submodule eagerly (eager_calls.py: its description is known "
                              "to this process only)")
        files: dict[str, str] = {}
        unreadable = []
        for code in codes:
            name = code.co_filename
            if name in files or _is_generated_code(name):
                continue
            digest = _file_hash(name)
            if digest is None:
                unreadable.append(code)
            else:
                files[name] = digest
        files.update(_files_of_generated_code(unreadable))
        enc = _Encoder()
        traces = {}
        parts = [("prologue", entry.prologue_traces, entry.prologue_fn, {"include_decorators": False}),
                 ("computation", entry.computation_traces, entry.computation_fn, {}),
                 ("epilogue", entry.epilogue_traces, entry.epilogue_fn, {})]
        if entry.backward_fn is not None:  # (its gradient variants: tangents.BackwardVariants.disk_state)
            parts.append(("backward", entry.backward_traces, entry.backward_fn, {}))
        for name, trcs, fn, kwargs in parts:
            trc = trcs[-1]
            # as printed for the callable just built (the same bound symbols, or what the callable was built from),
            # else printed again
            source, ctx = _thunder_internals.printed_trace(trc, fn, **kwargs) or (trc.python(**kwargs),
                                                                                 trc.python_ctx())
            uses_fn = "__function_obj" in source
            if uses_fn and trc.fn is not cd.fn:
                raise NotStorable(f"the {name} trace refers to a function other than the compiled one")
            described = {}
            for k, v in ctx.items():
                if k in _GLOBALS_SET_BY_THUNDER:
                    continue
                try:
                    described[k] = _executor_operator(cd, k, v) or enc.encode(v)
                except NotStorable as e:
                    raise NotStorable(f"{name} trace, name {k}: {e}") from None
            traces[name] = {"name": trc.siginfo().name, "source": source, "ctx": described, "function_obj": uses_fn}
        files.update(enc.files)
        return {"format": FORMAT, "files": files, "traces": traces,
                "return_none_instead_of_grads": bool(entry.return_none_instead_of_grads)}

    def _write(self, key: str, payload: dict) -> None:
        directory = self.root / key
        make_private_dirs(directory)
        reason = untrusted_reason(directory, self.base)
        if reason is not None:
            raise NotStorable(f"not written: {reason}")
        payload_text = json.dumps(payload, sort_keys=True)
        digest = hashlib.sha256(payload_text.encode()).hexdigest()
        text = json.dumps({"sha256": digest, "payload": payload_text})
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            path = directory / f"{digest[:32]}{_SUFFIX}"
            os.replace(tmp, path)
        except BaseException:
            _remove(pathlib.Path(tmp))
            raise
        self._evict(keep=path)

    def _evict(self, keep: pathlib.Path) -> None:
        """Past the size bound, remove the least recently used entries (never ``keep``, just written) until 90% of
        the bound is left."""
        if self.size_limit is None:
            return
        files = []
        total = 0
        for path in self.root.glob(f"*/*{_SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((st.st_mtime_ns, st.st_size, path))
            total += st.st_size
        if total <= self.size_limit:
            return
        for _, size, path in sorted(files):  # least recently used first
            if total <= self.size_limit * 0.9:
                break
            if path == keep:
                continue
            _remove(path)
            total -= size


def _bound_values(enc: _Encoder, fn) -> list:
    """What a compiled function holds besides its code, as part of the key: its closure's values, its default
    arguments and the object a bound method is bound to. thunder's prologue does not check every such value (an
    object read from a closure cell, e.g. ``program.fn`` where ``program`` is a cell's value, is taken as a constant
    of the trace: the same function object holds the same cells), so two functions of one code with other values
    must not share entries. Tensors are named by kind only (thunder passes them as inputs, checked by the prologue),
    and so is the module of a module's bound method (its reads are checked as a compiled module's are; a module in a
    closure cell is not: it is described by value, i.e. not storable); a value that cannot be described by value makes
    the function not storable."""

    def describe(v):
        if isinstance(v, torch.Tensor):
            return ["tensor"]
        try:
            return enc.encode(v)
        except NotStorable:
            if isinstance(v, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
                raise
            return enc.pickled(v)  # a callable object with value equality (a dataclass holding a function)

    try:
        cells = [c.cell_contents for c in getattr(fn, "__closure__", None) or ()]
    except ValueError:  # an empty cell (a name assigned after the function was made)
        raise NotStorable("the compiled function's closure has an unassigned variable") from None
    bound = getattr(fn, "__self__", None)
    try:
        return [[describe(v) for v in cells], describe(getattr(fn, "__defaults__", None)),
                describe(getattr(fn, "__kwdefaults__", None)),
                # a module's method (jit(model.forward)): what it reads from the module is checked, as for a module
                ["module", enc.ref(type(bound))] if isinstance(bound, torch.nn.Module) else describe(bound)]
    except NotStorable as e:
        raise NotStorable(f"the compiled function's closure, defaults or bound object: {e}") from None


def _code_digest(code: types.CodeType) -> str:
    """SHA-256 of what a code object does: its bytecode, names and constants (nested code objects likewise)."""
    h = hashlib.sha256()
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_argcount,
                   code.co_kwonlyargcount, code.co_flags)).encode())
    for c in code.co_consts:
        h.update(_code_digest(c).encode() if isinstance(c, types.CodeType) else repr(c).encode())
    return h.hexdigest()


def _executor_operator(cd, name: str, fn: Any) -> list | None:
    """``["executor_op", executor, name]`` when ``fn`` is what operator ``name`` of one of the jit's executors runs
    (thunder's executors register theirs when imported, often with a lambda: ``torchex``'s ``shallow_copy``), else
    None. The plugin's own executor is not asked: its lazily made symbols get numbered names (``flatten_TwoTensor_2``)
    that another process may give to another class; they are named by their factories."""
    if not callable(fn) or isinstance(fn, type):
        return None
    for ex in cd.executors_list:
        if ex.name == "thunder_subclass" or ex.name.startswith("__ad_hoc_executor"):
            continue
        if _thunder_internals.operator_implementation(ex.name, name) is fn:
            return ["executor_op", ex.name, name]
    return None


def _files_of_generated_code(codes: list) -> dict[str, str]:
    """The files behind code objects that have no file of their own (``<string>``): functions that ``dataclasses``
    generates from a class (their ``__module__`` is the class's module, whose file is hashed) and the methods of
    ``collections.namedtuple`` classes (made from the field names alone, which the code using them spells out).
    Anything else (code ``exec``-ed by the user, a notebook cell) is not storable: nothing on disk says whether it
    changed."""
    if not codes:
        return {}
    import gc

    owners: dict = {}
    for ref in gc.get_referrers(*codes):
        if isinstance(ref, types.FunctionType) and ref.__code__ in codes:
            owners.setdefault(ref.__code__, ref)
    files = {}
    for code in codes:
        fn = owners.get(code)
        module = getattr(fn, "__module__", None) or ""
        if module.startswith("namedtuple_"):
            continue
        file = getattr(sys.modules.get(module), "__file__", None)
        digest = _file_hash(file) if file else None
        if digest is None:
            raise NotStorable(f"traced code {code.co_name} from {code.co_filename}, which is not a readable file "
                              f"(module {module or '?'})")
        files[file] = digest
    return files


def _mtime(path: pathlib.Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _remove(path: pathlib.Path) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
