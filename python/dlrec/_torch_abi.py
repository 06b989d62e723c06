"""The C ABI library of dlrec.torch (libdlrec_torch.so, src/python/torch_abi.h) loaded with
ctypes and its function signatures set: no torch here, so tests/python/test_torch_abi.py checks
the library with NumPy alone."""
import ctypes
import os

_LIB = {}


def load_library(path=None):
    """The engine's C ABI library: `path`, or libdlrec_torch.so beside this file."""
    path = os.fspath(path) if path is not None else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "libdlrec_torch.so")
    if path in _LIB:
        return _LIB[path]
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"dlrec.torch: {path} not found (build the 'dlrec_torch' target, or pass library=)")
    lib = ctypes.CDLL(path)
    vp, i64, i64p = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
    sigs = {
        "dlrec_emb_abi_version": ([], ctypes.c_int),
        "dlrec_emb_has_cuda": ([], ctypes.c_int),
        "dlrec_emb_last_error": ([], ctypes.c_char_p),
        "dlrec_emb_create": ([ctypes.c_char_p, ctypes.POINTER(vp)], ctypes.c_int),
        "dlrec_emb_destroy": ([vp], None),
        "dlrec_emb_width": ([vp, i64p], ctypes.c_int),
        "dlrec_emb_forward": ([vp, vp, vp, i64, i64, vp, ctypes.c_int, vp, ctypes.c_int],
                              ctypes.c_int),
        "dlrec_emb_check": ([vp, vp], ctypes.c_int),
        "dlrec_emb_backward": ([vp, vp, ctypes.c_int, i64, ctypes.c_float, vp], ctypes.c_int),
        "dlrec_emb_table_size": ([vp, ctypes.c_int, ctypes.c_int, i64p, i64p], ctypes.c_int),
        "dlrec_emb_read_table": ([vp, ctypes.c_int, ctypes.c_int, vp, ctypes.c_int, vp],
                                 ctypes.c_int),
        "dlrec_emb_write_table": ([vp, ctypes.c_int, ctypes.c_int, vp, ctypes.c_int, vp],
                                  ctypes.c_int),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    if lib.dlrec_emb_abi_version() != 1:
        raise RuntimeError(f"dlrec.torch: {path} has ABI version {lib.dlrec_emb_abi_version()}, "
                           "this module speaks version 1")
    _LIB[path] = lib
    return lib
