"""C++ symbol demangling through the C++ runtime's own ``__cxa_demangle`` (libstdc++), no new dependency.

    demangle("_Z6saxpyifPfS_")  # "saxpyi(float, float*, float*)"

CUPTI's activity records name kernels by their mangled symbol; Kineto demangles them with the
same ``abi::__cxa_demangle``, so a kernel reads the same whichever collector recorded it. A name
that is not a mangled C++ symbol (``volta_sgemm_128x64_nn``, a C kernel) is returned unchanged,
as it is where no C++ runtime library can be loaded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _runtime() -> tuple[Any, Any] | None:
    """``__cxa_demangle`` and ``free``, or None where libstdc++ cannot be loaded."""
    name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        library = ctypes.CDLL(name)
        function = library.__cxa_demangle
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return function, free


@functools.lru_cache(maxsize=4096)
def demangle(symbol: str) -> str:
    """The demangled form of a C++ symbol (``_Z...``), or the name unchanged.

    Args:
        symbol: a kernel or function name as CUPTI reports it.

    Returns:
        What Kineto would show for it.
    """
    if not symbol.startswith("_Z"):
        return symbol
    runtime = _runtime()
    if runtime is None:
        return symbol
    function, free = runtime
    status = ctypes.c_int()
    pointer = function(symbol.encode(), None, None, ctypes.byref(status))
    if not pointer:
        return symbol
    try:
        text = ctypes.string_at(pointer).decode(errors="replace")
    finally:
        free(pointer)
    return text if status.value == 0 else symbol
