"""The ctypes layer over libaft.so: finding and loading the library, the
argument and return types of every function of aft.h's binding interface
(its section "the binding interface", AFT_API_VERSION 1) and of the kernel
levels, and the one place a status becomes a Python exception.

Private: the public API is the package's (aft.Layer, aft.op, ...). aft.torch
may call it; everything else should not.

Where the library comes from, first found:
  1. $AFT_LIBRARY, a path to a libaft.so (nothing else is tried);
  2. libaft.so beside this file (an installed package: pip puts it there);
  3. the source tree's lib/libaft.so (python/aft/ in the tree, after make);
  4. the system's: ctypes.util.find_library("aft"), then "libaft.so.1".

ctypes.CDLL releases the GIL for the length of every call (PyDLL would hold
it): compute in one thread does not stop the others.
"""

import ctypes
import ctypes.util
import os

# the interface this package was written for: aft_api_version() must say it
API_VERSION = 1

# aft_status
OK, ERR_IO, ERR_FORMAT, ERR_NOMEM, ERR_ARG = 0, 1, 2, 3, 4

_c_size_p = ctypes.POINTER(ctypes.c_size_t)
_c_char_pp = ctypes.POINTER(ctypes.c_char_p)
_vp = ctypes.c_void_p
_sz = ctypes.c_size_t
_st = ctypes.c_int  # aft_status, an enum
_err = ctypes.c_void_p  # aft_error *: a 512-byte buffer (its msg)
ERROR_SIZE = 512


class Level(ctypes.Structure):
    """aft.h's aft_level: one kernel level built in."""
    _fields_ = [("name", ctypes.c_char_p), ("needs", ctypes.c_char_p), ("runs", ctypes.c_int),
                ("why", ctypes.c_char * 80)]


# name: (restype, argtypes). Pointers to data the caller owns are c_void_p,
# so a call passes an array's address (ndarray.ctypes.data, an int) without
# building a ctypes pointer object.
_SIGNATURES = {
    "aft_api_version": (ctypes.c_int, []),
    # files
    "aft_api_file_read": (_st, [ctypes.POINTER(_vp), ctypes.c_char_p, _err]),
    "aft_api_file_free": (None, [_vp]),
    "aft_api_file_count": (_sz, [_vp]),
    "aft_api_file_tensor": (_st, [_vp, _sz, _c_char_pp, _c_char_pp, _c_size_p, _c_size_p, _c_size_p, _err]),
    "aft_api_file_copy": (_st, [_vp, _sz, _vp, _sz, _err]),
    "aft_api_file_metadata_count": (_sz, [_vp]),
    "aft_api_file_metadata": (None, [_vp, _sz, _c_char_pp, _c_char_pp]),
    "aft_api_file_write": (_st, [ctypes.c_char_p, _sz, _vp, _vp, _vp, _vp, _vp, _sz, _vp, _vp, _err]),
    # the layer
    "aft_api_layer_new": (_st, [ctypes.POINTER(_vp), _sz, _vp, _vp, _vp, _vp, ctypes.c_char_p, _err]),
    "aft_api_layer_free": (None, [_vp]),
    "aft_api_layer_dims": (None, [_vp, _c_size_p, _c_size_p]),
    "aft_api_layer_forward": (_st, [_vp, _vp, _vp, _sz, _sz, _err]),
    "aft_api_layer_grad_count": (_sz, [_vp]),
    "aft_api_layer_grad_info": (_st, [_vp, _sz, _c_char_pp, _c_size_p, _c_size_p, _err]),
    "aft_api_layer_backward": (_st, [_vp, _vp, _vp, _vp, _vp, _vp, _sz, _sz, _err]),
    "aft_api_layer_saved_size": (_st, [_vp, _sz, _sz, _c_size_p, _err]),
    "aft_api_layer_forward_saved": (_st, [_vp, _vp, _vp, _sz, _vp, _sz, _sz, _err]),
    "aft_api_layer_backward_saved": (_st, [_vp, _vp, _vp, _vp, _vp, _vp, _sz, _sz, _sz, _err]),
    # streaming
    "aft_api_state_new": (_st, [ctypes.POINTER(_vp), _vp, _sz, _err]),
    "aft_api_state_free": (None, [_vp]),
    "aft_api_state_step": (_st, [_vp, _vp, _vp, _sz, _err]),
    "aft_api_state_position": (_sz, [_vp]),
    "aft_api_state_save": (_st, [_vp, ctypes.c_char_p, _err]),
    "aft_api_state_load": (_st, [_vp, ctypes.c_char_p, _err]),
    # the bare operator
    "aft_api_op_forward": (_st, [_vp, _vp, _vp, _vp, _sz, _sz, _sz, _sz, _vp, _sz, _sz, _vp, ctypes.c_int,
                                 ctypes.c_char_p, _err]),
    "aft_api_op_backward": (_st, [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _sz, _sz, _sz, _sz, _vp, _sz, _sz,
                                  _vp, ctypes.c_int, ctypes.c_char_p, _err]),
    "aft_api_op_saved_size": (_st, [_sz, _sz, _sz, _sz, _vp, _sz, _sz, _vp, ctypes.c_int, ctypes.c_char_p, _c_size_p,
                                    _err]),
    "aft_api_op_forward_saved": (_st, [_vp, _vp, _sz, _vp, _vp, _vp, _sz, _sz, _sz, _sz, _vp, _sz, _sz, _vp,
                                       ctypes.c_int, ctypes.c_char_p, _err]),
    "aft_api_op_backward_saved": (_st, [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _sz, _sz, _sz, _sz, _sz, _vp,
                                        _sz, _sz, _vp, ctypes.c_int, ctypes.c_char_p, _err]),
    # the model
    "aft_api_model_open": (_st, [ctypes.POINTER(_vp), ctypes.c_char_p, ctypes.c_char_p, _err]),
    "aft_api_model_free": (None, [_vp]),
    "aft_api_model_dims": (None, [_vp, _c_size_p, _c_size_p, _c_size_p]),
    "aft_api_model_logits": (_st, [_vp, _vp, _vp, _sz, _sz, _err]),
    "aft_api_model_encode": (_st, [_vp, _vp, _sz, _c_size_p, ctypes.c_char_p, _sz, _err]),
    "aft_api_model_token": (ctypes.c_char_p, [_vp, _sz]),
    "aft_api_model_generate": (_st, [_vp, _vp, _sz, _c_size_p, ctypes.c_char_p, _sz, ctypes.c_double, _sz,
                                     ctypes.c_uint64, _err]),
    # kernel levels (aft.h)
    "aft_levels": (ctypes.POINTER(Level), [_c_size_p]),
    "aft_level_in_use": (_sz, []),
    "aft_bf16_engine_in_use": (ctypes.c_char_p, []),
    "aft_level_use": (_st, [ctypes.c_char_p, _err]),
}


def _candidates():
    """The paths to try, in order, with where each comes from."""
    env = os.environ.get("AFT_LIBRARY")
    if env:
        return [(env, "AFT_LIBRARY")]
    here = os.path.dirname(os.path.realpath(__file__))
    found = []
    for name in ("libaft.so", "libaft.so.1"):
        found.append((os.path.join(here, name), "the package"))
    found.append((os.path.join(os.path.dirname(os.path.dirname(here)), "lib", "libaft.so"), "the source tree"))
    system = ctypes.util.find_library("aft")
    if system:
        found.append((system, "the system"))
    found.append(("libaft.so.1", "the system"))
    return found


def _open():
    """(the CDLL, its path) of the first library found; ImportError if none."""
    tried = []
    for path, where in _candidates():
        if where != "AFT_LIBRARY" and os.path.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            if where == "AFT_LIBRARY":
                raise ImportError("aft: AFT_LIBRARY=%s: %s" % (path, e)) from None
            tried.append("%s (%s)" % (path, e))
    raise ImportError("aft: libaft.so not found (run make in the source tree, install aft, or set AFT_LIBRARY); "
                      "tried: " + "; ".join(tried))


def _declare(lib, path):
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError("aft: %s lacks %s: an older libaft? (this package needs interface version %d)"
                              % (path, name, API_VERSION)) from None
        fn.restype = restype
        fn.argtypes = argtypes


def _check_version(lib, path):
    """The interface version first: a library of another version may lack
    functions, and the versions say why."""
    try:
        fn = lib.aft_api_version
    except AttributeError:
        raise ImportError("aft: %s lacks aft_api_version: not a libaft with the binding interface "
                          "(this package needs interface version %d)" % (path, API_VERSION)) from None
    fn.restype, fn.argtypes = ctypes.c_int, []
    have = fn()
    if have != API_VERSION:
        raise ImportError("aft: %s has interface version %d, but this aft package was written for version %d"
                          % (path, have, API_VERSION))


lib, path = _open()
_check_version(lib, path)
_declare(lib, path)


def error_buffer():
    """A fresh aft_error for one call (its msg: 512 bytes)."""
    return ctypes.create_string_buffer(ERROR_SIZE)


def message(err):
    """The one-line message in an error buffer."""
    return err.value.decode("utf-8", "replace")


def raise_for(status, err):
    """Raises the exception of status with the message in err."""
    msg = message(err) or "aft: status %d" % status
    if status == ERR_IO:
        raise OSError(msg)
    if status == ERR_NOMEM:
        raise MemoryError(msg)
    raise ValueError(msg)  # AFT_ERR_ARG, AFT_ERR_FORMAT (and a status this package does not know)


def call(fn, *args):
    """fn(*args, err): returns on AFT_OK, raises the status's exception
    otherwise."""
    err = ctypes.create_string_buffer(ERROR_SIZE)
    st = fn(*args, err)
    if st != OK:
        raise_for(st, err)


class Owned:
    """A library handle in self._h (guarded by self._lock), freed by close(),
    when collected, and on leaving a with block. A subclass's close(self,
    _free=lib.aft_api_..._free) calls self._release(_free): the default binds
    the function while the module is alive, so freeing still works during
    interpreter shutdown."""

    def _release(self, free):
        with self._lock:
            h, self._h = self._h, None
            if h:
                free(h)

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
