"""ggml's backend registry and RPC entry points, through ctypes on the wheel's own libraries.

llama-cpp-python binds llama.h only; the device list, the RPC client (add a worker, ask its
memory) and the RPC server (what `localspec rpc-worker` runs) are ggml functions in the
libraries it ships, already loaded with libllama. Every RPC call here must come after
rpc.check_reachable: ggml-rpc aborts the process when a worker refuses the connection.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import llama_cpp

from localspec.engine.rpc import unsupported

DEVICE_CPU, DEVICE_GPU, DEVICE_IGPU = 0, 1, 2
_size_t_p = ctypes.POINTER(ctypes.c_size_t)


@cache
def _base() -> ctypes.CDLL:
    llama_cpp.llama_backend_init()  # loads the backends (the registry is filled on first use)
    lib = _load("ggml-base")
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, _size_t_p, _size_t_p]
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    return lib


def _load(name: str) -> ctypes.CDLL:
    """One of the wheel's libraries (already loaded with libllama: this finds the same handle)."""
    folder = Path(llama_cpp.__file__).parent / "lib"
    for file in (f"lib{name}.so", f"lib{name}.dylib", f"{name}.dll"):
        if (folder / file).exists():
            return ctypes.CDLL(str(folder / file))
    raise OSError(f"{name} is not in {folder}")


@cache
def _registry() -> ctypes.CDLL:
    """libggml: the registry of backends (ggml_backend_reg_by_name lives there, not in ggml-base)."""
    lib = _load("ggml")
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    return lib


def rpc_supported() -> bool:
    """Whether this llama.cpp build has the RPC backend."""
    llama_cpp.llama_backend_init()
    return bool(llama_cpp.llama_supports_rpc())


def local_devices() -> list[tuple[str, int]]:
    """(name, type) of each device llama.cpp found on this machine (the CPU, GPUs), not RPC workers."""
    _base()
    reg = _registry()
    out = []
    for i in range(int(reg.ggml_backend_dev_count())):
        dev = reg.ggml_backend_dev_get(i)
        out.append((_base().ggml_backend_dev_name(dev).decode(), int(_base().ggml_backend_dev_type(dev))))
    return out


# llama.cpp's AMX weight buffers crash the process in ggml_backend_amx_mul_mat on some Intel CPUs
# with AMX (Sapphire Rapids and later): seen here on a 2-vCPU KVM Xeon, at the first decode of both
# Qwen2.5-Coder models; upstream ggml-org/llama.cpp#20824, open without a fix. Repacked weights
# (CPU_REPACK, the next extra buffer type) run the same models at full speed, so AMX is never used.
UNSAFE_EXTRA_BUFFERS = ("AMX",)


def _extra_bufts() -> Any:
    """The CPU's extra buffer types that models load into: a null-terminated array owned by
    ggml-cpu (a copy made for model loading, read again at each load), or None."""
    base = _base()
    reg = _registry().ggml_backend_reg_by_name(b"CPU")
    if not reg:
        return None
    address = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return None
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)
    return get(base.ggml_backend_reg_dev_get(reg, 0))


def extra_buffer_types() -> list[str]:
    """The names of the CPU's extra buffer types a model load may choose (AMX, CPU_REPACK, ...)."""
    bufts, names, i = _extra_bufts(), [], 0
    while bufts is not None and bufts[i]:
        names.append((_base().ggml_backend_buft_name(bufts[i]) or b"").decode(errors="replace"))
        i += 1
    return names


def drop_extra_buffer_types(names: Sequence[str] = UNSAFE_EXTRA_BUFFERS) -> list[str]:
    """Take these buffer types out of the CPU's extra buffer types that models load into; the names
    of those removed. Call before loading any model.

    Removing an entry in place, shifting the rest left with the terminator, makes every later load
    choose among the others, as llama.cpp reads the array again at each load.
    """
    bufts = _extra_bufts()
    present = extra_buffer_types()
    kept = [bufts[i] for i, name in enumerate(present) if name not in names]
    for j, buft in enumerate(kept):
        bufts[j] = buft
    for j in range(len(kept), len(present)):
        bufts[j] = None
    return [name for name in present if name in names]


def has_local_gpu() -> bool:
    """A GPU on this machine (llama_supports_gpu_offload also says yes for any build with RPC)."""
    return any(kind in (DEVICE_GPU, DEVICE_IGPU) for _, kind in local_devices())


def _rpc_proc(name: str) -> int:
    reg = _registry().ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise unsupported()
    address = _base().ggml_backend_reg_get_proc_address(reg, name.encode())
    if not address:
        raise unsupported()
    return int(address)


def add_workers(endpoints: Sequence[str]) -> list[int]:
    """The devices of each worker (checked reachable first), for llama_model_params.devices.

    Not registered globally (as llama.cpp's --rpc does): only the model given these devices
    uses them, so the draft, loaded with the default device list, stays on this machine.
    """
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(_rpc_proc("ggml_backend_rpc_add_server"))
    devices: list[int] = []
    for endpoint in endpoints:
        reg = add(endpoint.encode())
        if not reg:
            from localspec.errors import RpcWorkerError

            raise RpcWorkerError(f"the RPC worker at {endpoint} offers no device")
        for i in range(int(_base().ggml_backend_reg_dev_count(reg))):
            devices.append(int(_base().ggml_backend_reg_dev_get(reg, i)))
    return devices


def device_memory(device: int) -> tuple[int, int]:
    """(free, total) bytes of a device; for an RPC device, asked of its worker."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _base().ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
    return int(free.value), int(total.value)


def worker_memory(endpoints: Sequence[str]) -> list[tuple[int, int]]:
    """(free, total) bytes each worker reports (its first device), in endpoint order."""
    _rpc_proc("ggml_backend_rpc_add_server")  # RpcUnsupportedError without the backend
    # Not offered through the registry's proc addresses: the library's own export.
    fn = _load("ggml-rpc").ggml_backend_rpc_get_device_memory
    fn.argtypes = [ctypes.c_char_p, ctypes.c_uint32, _size_t_p, _size_t_p]
    fn.restype = None
    out = []
    for endpoint in endpoints:
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        fn(endpoint.encode(), 0, ctypes.byref(free), ctypes.byref(total))
        out.append((int(free.value), int(total.value)))
    return out


def rpc_server(endpoint: str, threads: int, cache_dir: str | None = None) -> Callable[[], None]:
    """llama.cpp's RPC server on `endpoint` with this machine's GPUs, else its CPU, ready to run:
    the call blocks, and returns only when the server could not start (it prints why on stderr)."""
    start = ctypes.CFUNCTYPE(
        None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p
    )(_rpc_proc("ggml_backend_rpc_start_server"))
    devices = _serving_devices()
    array = (ctypes.c_void_p * len(devices))(*devices)
    where = cache_dir.encode() if cache_dir else None
    return lambda: start(endpoint.encode(), where, threads, len(devices), array)


def _serving_devices() -> list[int]:
    """rpc-server's choice: every GPU-like device, else the CPU."""
    reg = _registry()
    devices = [reg.ggml_backend_dev_get(i) for i in range(int(reg.ggml_backend_dev_count()))]
    gpus = [d for d in devices if int(_base().ggml_backend_dev_type(d)) not in (DEVICE_CPU, 3)]
    return gpus or [d for d in devices if int(_base().ggml_backend_dev_type(d)) == DEVICE_CPU]
