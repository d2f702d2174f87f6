"""Submission code in a sandbox of its own: the grader's evaluation script calls it through a pipe, never in-process.

Not imported by gym_llm: :mod:`gym_llm.envs.mlgym.workspace` writes this file's source, unchanged, into two
sandboxes of one evaluation (standard library only; numpy is used when the values carry arrays):

* the **submission sandbox** runs ``python _gym_llm_bridge.py serve CALL REPLY SEED MODULE...``: it imports the
  agent's modules (``strategy``, ``heuristic``) in its own workspace and answers calls;
* the **grading sandbox** gets, in place of each submitted ``.py`` file, a three-line module that asks
  :func:`install` for one function per public name of the agent's module. The task's evaluation script imports it
  as it would import the agent's file, and each call crosses to the submission sandbox and back.

The two sandboxes share nothing but two FIFOs in a folder bound read-only into both (a FIFO on a read-only mount
still carries data; its name is a random token). So code in a submission can no longer patch the evaluator, print a
score line of its own, register an ``atexit`` hook, shadow a module the evaluator imports later, or read the hidden
files the evaluator reads: it does not run in that process, that sandbox or that file system. What it can still do
is return values, which arrive as data (a small JSON encoding: no pickle), as copies.

Frames (see below); requests ``{"id", "op": "import"|"call"|"getattr", ...}``, replies
``{"id", "ok": true, "value"}`` or ``{"id", "ok": false, "error", "type"}``.

Values cross as None, bool, int, float, str, bytes, list, tuple, dict (any such keys), set, frozenset, Counter,
OrderedDict, defaultdict (of int/float/list/dict/set/str/bool) and numpy arrays and scalars of bool/int/float
dtypes; anything else is refused with a TypeError that names it.
"""

import base64
import builtins
import collections
import errno
import json
import marshal
import os
import struct
import sys
import time
import traceback

MAX_FRAME_BYTES = 1 << 26  # a reply larger than this is refused (64 MiB)
CONNECT_TIMEOUT_S = 120.0  # the grader waits this long for the submission's process to open its end

_FACTORIES = {"int": int, "float": float, "list": list, "dict": dict, "set": set, "str": str, "bool": bool}
_NUMPY_KINDS = "biuf"


# ----------------------------------------------------------------------------------------------- values
def encode(value):
    """``value`` as JSON-ready data; containers that JSON lacks are one-key objects tagged ``"__<kind>"``."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(v) for v in value]
    if kind is tuple:
        return {"__t": [encode(v) for v in value]}
    if kind is dict:
        if all(type(k) is str and not k.startswith("__") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"__d": _pairs(value)}
    if isinstance(value, collections.defaultdict):
        factory = value.default_factory
        name = None if factory is None else getattr(factory, "__name__", None)
        if factory is not None and _FACTORIES.get(name) is not factory:
            raise TypeError(f"a defaultdict of {factory!r} cannot cross to the other process "
                            f"(supported: {sorted(_FACTORIES)} or None)")
        return {"__dd": name, "items": _pairs(value)}
    if isinstance(value, collections.Counter):
        return {"__c": _pairs(value)}
    if isinstance(value, collections.OrderedDict):
        return {"__od": _pairs(value)}
    if kind is set:
        return {"__s": [encode(v) for v in value]}
    if kind is frozenset:
        return {"__fs": [encode(v) for v in value]}
    if kind in (bytes, bytearray):
        return {"__b": base64.b64encode(value).decode()}
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        if value.dtype.kind not in _NUMPY_KINDS:
            raise TypeError(f"a numpy value of dtype {value.dtype} cannot cross to the other process "
                            "(supported: bool, int, uint and float dtypes)")
        if isinstance(value, numpy.ndarray):
            return {"__nd": value.dtype.str, "shape": list(value.shape), "data": value.ravel().tolist()}
        return {"__np": value.dtype.str, "value": value.item()}
    if isinstance(value, (bool, int, float, str)):  # subclasses (IntEnum, ...): their plain value
        return _plain(value)
    raise TypeError(f"a {kind.__module__}.{kind.__qualname__} cannot cross to the other process: the submission "
                    "runs in a sandbox of its own and exchanges plain data (numbers, strings, lists, tuples, dicts, "
                    "sets, numpy arrays) with the evaluation script")


def _plain(value):
    for base in (bool, int, float, str):
        if isinstance(value, base):
            return base(value)
    raise AssertionError(value)


def _pairs(mapping):
    return [[encode(k), encode(v)] for k, v in mapping.items()]


def decode(data):
    """The inverse of :func:`encode`; refuses anything it would not have written."""
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(v) for v in data]
    if kind is not dict:
        raise ValueError(f"unexpected {kind.__name__} in a message")
    if len(data) == 1:
        (tag, body), = data.items()
        if tag == "__t":
            return tuple(decode(v) for v in _list(body))
        if tag == "__d":
            return dict(_unpairs(body))
        if tag == "__c":
            return collections.Counter(dict(_unpairs(body)))
        if tag == "__od":
            return collections.OrderedDict(_unpairs(body))
        if tag == "__s":
            return {decode(v) for v in _list(body)}
        if tag == "__fs":
            return frozenset(decode(v) for v in _list(body))
        if tag == "__b":
            if type(body) is not str:
                raise ValueError("bytes must be base64 text")
            return base64.b64decode(body, validate=True)
    if "__dd" in data and set(data) == {"__dd", "items"}:
        name = data["__dd"]
        if name is not None and name not in _FACTORIES:
            raise ValueError(f"defaultdict factory {name!r} is not allowed")
        return collections.defaultdict(None if name is None else _FACTORIES[name], _unpairs(data["items"]))
    if "__nd" in data and set(data) == {"__nd", "shape", "data"}:
        numpy = _numpy_dtype_check(data["__nd"])
        shape = data["shape"]
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError("an array's shape must be a list of non-negative ints")
        return numpy.array(_list(data["data"]), dtype=data["__nd"]).reshape(shape)
    if "__np" in data and set(data) == {"__np", "value"}:
        numpy = _numpy_dtype_check(data["__np"])
        value = data["value"]
        if type(value) not in (bool, int, float):
            raise ValueError("a numpy scalar's value must be a number")
        return numpy.dtype(data["__np"]).type(value)
    if any(type(k) is str and k.startswith("__") for k in data):
        raise ValueError(f"unknown tagged value {sorted(data)[:3]}")
    return {k: decode(v) for k, v in data.items()}


def _list(body):
    if type(body) is not list:
        raise ValueError("a tagged container must hold a list")
    return body


def _unpairs(body):
    out = []
    for pair in _list(body):
        if type(pair) is not list or len(pair) != 2:
            raise ValueError("a mapping must hold [key, value] pairs")
        out.append((decode(pair[0]), decode(pair[1])))
    return out


def _numpy_dtype_check(dtype):
    import numpy

    if type(dtype) is not str or numpy.dtype(dtype).kind not in _NUMPY_KINDS:
        raise ValueError(f"numpy dtype {dtype!r} is not allowed (bool, int, uint, float only)")
    return numpy


# ----------------------------------------------------------------------------------------------- frames
# 4-byte big-endian length, one kind byte, the payload. Kind b"M": marshal, used only grader -> submission (the
# grader's own values, exact types: tuples stay tuples, and marshal refuses every subclass); kind b"J": JSON, which
# is all the grader accepts from the submission.
def write_frame(fd, kind, payload, _pack=struct.pack, _write=os.write):
    view = memoryview(_pack(">IB", len(payload), kind) + payload)
    while view:
        view = view[_write(fd, view):]


class Reader:
    """Frames from a blocking fd, read in chunks of up to 64 KiB (one read per small frame).

    No spinning before sleeping: it can save a sleeping vCPU's wake-up on an idle machine, but under CPU contention a
    spinning reader that yields hands its slice to other processes (measured here, two busy processes beside the
    pair: 54-78 us per call blocking, 1,017 us spinning 100 us with sched_yield; the suite's MLGym tests ran 4-6x
    slower with the spin)."""

    def __init__(self, fd):
        os.set_blocking(fd, True)
        self.fd, self.buffer = fd, bytearray()

    def frame(self, _unpack=struct.unpack, _read=os.read):
        """``(kind, payload)`` of the next frame; EOFError when the other side closed."""
        buffer = self.buffer
        while True:
            if len(buffer) >= 5:
                size, kind = _unpack(">IB", buffer[:5])
                if size > MAX_FRAME_BYTES:
                    raise BridgeError(f"the other side sent a {size}-byte message (the limit is {MAX_FRAME_BYTES})")
                if len(buffer) >= 5 + size:
                    payload = bytes(buffer[5:5 + size])
                    del buffer[:5 + size]
                    return kind, payload
            chunk = _read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError("the other side closed the channel")
            buffer += chunk


KIND_MARSHAL, KIND_JSON = ord("M"), ord("J")
_EXACT = frozenset({type(None), bool, int, float, complex, str, bytes})


def _marshal_exact(value):
    """Whether marshal round-trips ``value`` with its exact types (it would write a numpy array or a bytearray as
    bytes, and a dict subclass not at all)."""
    kind = type(value)
    if kind in _EXACT:
        return True
    if kind is tuple or kind is list or kind is set or kind is frozenset:
        return all(map(_marshal_exact, value))
    if kind is dict:
        return all(_marshal_exact(k) and _marshal_exact(v) for k, v in value.items())
    return False


class BridgeError(RuntimeError):
    """The submission's process failed, left, or broke the protocol."""


# ----------------------------------------------------------------------------------------------- grader side
class _Channel:
    def __init__(self, call_path, reply_path):
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:  # O_NONBLOCK: ENXIO until the submission's process has opened the read end
            try:
                fd = os.open(call_path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as e:
                if e.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise BridgeError(f"the submission's process did not start within {CONNECT_TIMEOUT_S:g} s "
                                      f"({e})") from None
                time.sleep(0.005)
        os.set_blocking(fd, True)
        self.call_fd = fd
        self.reader = Reader(os.open(reply_path, os.O_RDONLY))  # the submission opens its end right after ours
        self.next_id = 0

    def request(self, message):
        self.next_id += 1
        message["id"] = self.next_id
        if _marshal_exact(message):
            payload, kind = marshal.dumps(message), KIND_MARSHAL
        else:  # a type marshal would not keep (defaultdict, numpy, a subclass): the tagged JSON
            message = dict(message, args=encode(list(message.get("args", ()))), kwargs=encode(message.get("kwargs", {})))
            payload, kind = json.dumps(message).encode(), KIND_JSON
        try:
            write_frame(self.call_fd, kind, payload)
            kind, payload = self.reader.frame()
            if kind != KIND_JSON:
                raise ValueError("a reply must be JSON")
            reply = json.loads(payload)
        except (OSError, EOFError, ValueError, RecursionError) as e:
            raise BridgeError(f"the submission's process stopped answering ({type(e).__name__}: {e})") from None
        if type(reply) is not dict or reply.get("id") != self.next_id or type(reply.get("ok")) is not bool:
            raise BridgeError("the submission's process sent a malformed reply")
        if not reply["ok"]:
            name = reply.get("type")
            error = getattr(builtins, name, None) if type(name) is str else None
            if not (isinstance(error, type) and issubclass(error, Exception)):
                error = BridgeError
            raise error(f"{reply.get('error', '')} (raised in the submission's code)")
        return _decoded(reply.get("value"))


_CHANNEL = None


def _decoded(data):
    try:
        return decode(data)
    except (ValueError, TypeError, RecursionError) as e:
        raise BridgeError(f"the submission's process sent a value that is not plain data: {e}") from None


def install(namespace, module):
    """Fill a proxy module's ``namespace`` with forwarding functions for ``module``'s public names."""
    global _CHANNEL
    if _CHANNEL is None:
        _CHANNEL = _Channel(*CHANNEL_PATHS)
    channel = _CHANNEL
    names = channel.request({"op": "import", "module": module})

    def forwarder(name):
        def call(*args, **kwargs):
            return channel.request({"op": "call", "module": module, "name": name, "args": args, "kwargs": kwargs})
        call.__name__ = call.__qualname__ = name
        call.__doc__ = f"{module}.{name}, run in the submission's own sandbox."
        return call

    if type(names) is not list:
        raise BridgeError(f"the submission's process sent a malformed name list for {module!r}")
    for entry in names:  # [name, "function"] or [name, "value", value]
        if type(entry) is not list or len(entry) < 2 or type(entry[0]) is not str or not entry[0].isidentifier() \
                or entry[0].startswith("__") or entry[1] not in ("function", "value"):
            raise BridgeError(f"the submission's module {module!r} reported a bad name {entry!r}")
        namespace[entry[0]] = forwarder(entry[0]) if entry[1] == "function" else (entry[2] if len(entry) > 2 else None)
    namespace["__all__"] = [entry[0] for entry in names]

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return channel.request({"op": "getattr", "module": module, "name": name})

    namespace["__getattr__"] = __getattr__


CHANNEL_PATHS = ("", "")  # set by the grader's copy of this file


# ----------------------------------------------------------------------------------------------- submission side
def _public_names(module):
    """``[name, "function"]`` per callable defined in ``module`` (or listed in its ``__all__``), ``[name, "value",
    encoded]`` per plain-data constant; modules, imported names and values that cannot cross are left out."""
    import types

    listed = getattr(module, "__all__", None)
    out = []
    for name in (listed if listed is not None else list(vars(module))):
        value = getattr(module, name, None)
        if name.startswith("_") and listed is None or isinstance(value, types.ModuleType):
            continue
        if callable(value):
            if listed is not None or getattr(value, "__module__", None) == module.__name__:
                out.append([name, "function"])
            continue
        try:
            out.append([name, "value", encode(value)])
        except TypeError:
            continue
    return out


def serve(call_path, reply_path, seed, modules):
    """Answer the grader's requests until it closes the channel (its evaluation ended). What the server needs is
    bound before the agent's modules run, so code that patches ``json`` or ``marshal`` does not break it."""
    import importlib
    import random

    loads, dumps, unmarshal = json.loads, json.dumps, marshal.loads
    sys.path.insert(0, os.getcwd())
    if seed is not None:
        random.seed(seed)
    reader = Reader(os.open(call_path, os.O_RDONLY))
    reply_fd = os.open(reply_path, os.O_WRONLY)
    loaded = {}
    while True:
        try:
            kind, payload = reader.frame()
        except EOFError:
            return
        message = unmarshal(payload) if kind == KIND_MARSHAL else loads(payload)
        if kind != KIND_MARSHAL:
            message["args"], message["kwargs"] = decode(message.get("args", [])), decode(message.get("kwargs", {}))
        reply = {"id": message.get("id"), "ok": True}
        try:
            module_name = message["module"]
            if module_name not in modules:
                raise ValueError(f"module {module_name!r} is not part of the submission")
            if message["op"] == "import":
                module = loaded[module_name] = importlib.import_module(module_name)
                reply["value"] = _public_names(module)
            elif message["op"] == "getattr":
                reply["value"] = encode(getattr(loaded[module_name], message["name"]))
            elif message["op"] == "call":
                function = getattr(loaded[module_name], message["name"])
                reply["value"] = encode(function(*message["args"], **message["kwargs"]))
            else:
                raise ValueError(f"unknown op {message['op']!r}")
            payload = dumps(reply).encode()
        except Exception as e:
            traceback.print_exc()
            payload = dumps({"id": message.get("id"), "ok": False, "type": type(e).__name__,
                             "error": f"{type(e).__name__}: {e}"[:4000]}).encode()
        write_frame(reply_fd, KIND_JSON, payload)


if __name__ == "__main__" and len(sys.argv) >= 5 and sys.argv[1] == "serve":
    serve(sys.argv[2], sys.argv[3], None if sys.argv[4] == "none" else int(sys.argv[4]), sys.argv[5:])
