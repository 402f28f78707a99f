"""How the pyo3 front end sees the Python objects it is given (the Python
half of src/python/buffer.rs; the compiled modules' equivalent is the C++
glue's describe_tensor).

Accepted: torch tensors (through their Python interface only: data_ptr,
numel, element_size, is_pinned, device, is_contiguous, and copy_ for the
bounce path of CUDA and strided tensors), numpy arrays (through
``__array_interface__``) and any buffer-protocol object (bytearray,
memoryview, mmap, array.array, ...), reached through ctypes so that the
abi3 module needs no buffer API. Nothing here imports torch or numpy: an
object is recognised by its interface.

``describe(obj, into)`` returns a ``Description`` (a named tuple, whose
field order src/python/buffer.rs checks once against ``Description._fields``
and then unpacks by position, as cheaply as a plain tuple).

``hold`` is what the op keeps until ``wait()`` finishes it (the object, or
the ctypes view that holds its buffer export, so a bytearray cannot be
resized and an mmap cannot be closed under the I/O). ``copier`` is None for
contiguous host memory (the core copies with memcpy) and otherwise an object
with ``to_bounce(addr, n)`` and ``from_bounce(addr, n)``. ``extent`` is None
for memory that cannot move while ``hold`` lives (a held buffer export), and
for a torch tensor or a numpy array an object naming it (``_TensorExtent``,
``_ArrayExtent``), which the core asks where its bytes are now: a tensor's storage can be swapped or resized
while its op is in flight (``set_``, ``resize_``, ``.data =``), an array's
too (``resize(..., refcheck=False)``), so the core copies a bounced read
into it only at ``wait()``, after checking it has not moved (the compiled
modules' glue does the same for tensors).
"""

import collections
import ctypes
import re

__all__ = ["Description", "describe", "locked_object"]

#: What the core needs of an object: its address and size, the element size
#: and first dimension DeepSpeed's checks use, where it lives, whether it is
#: contiguous, pinned and has a storage, what the op holds, how to copy it
#: when it is not plain host memory, and where its bytes are now (below).
Description = collections.namedtuple("Description", (
    "ptr", "nbytes", "element_size", "dim0", "device", "device_index",
    "contiguous", "pinned", "has_storage", "hold", "copier", "extent"))


def _bytes_at(addr, nbytes):
    """A writable ctypes view of `nbytes` bytes at `addr` (no copy)."""
    return (ctypes.c_uint8 * nbytes).from_address(addr)


def _is_tensor(obj):
    return callable(getattr(obj, "data_ptr", None)) and callable(getattr(obj, "element_size", None)) \
        and hasattr(obj, "device")


class _TensorCopier:
    """Bounce copies of a CUDA or strided tensor, with the tensor's own copy_."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def _bounce(self, addr, n):
        import torch

        t = self.tensor
        flat = torch.frombuffer(_bytes_at(addr, n), dtype=torch.uint8)
        return flat.view(t.dtype).view(t.shape)

    def to_bounce(self, addr, n):
        if n:
            self._bounce(addr, n).copy_(self.tensor)

    def from_bounce(self, addr, n):
        if n:
            self.tensor.copy_(self._bounce(addr, n))


class _ArrayCopier:
    """Bounce copies of a strided numpy array."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def _bounce(self, addr, n):
        import numpy

        a = self.array
        return numpy.frombuffer(_bytes_at(addr, n), dtype=a.dtype).reshape(a.shape)

    def to_bounce(self, addr, n):
        if n:
            import numpy

            numpy.copyto(self._bounce(addr, n), self.array)

    def from_bounce(self, addr, n):
        if n:
            import numpy

            numpy.copyto(self.array, self._bounce(addr, n))


def _tensor_address(t):
    """(ptr, nbytes) of a tensor's bytes as they are now."""
    # From the storage rather than data_ptr(): torch answers 0 for an empty
    # tensor, which still points into its storage.
    base = t.untyped_storage().data_ptr()
    ptr = base + t.storage_offset() * t.element_size() if base else 0
    return ptr, t.numel() * t.element_size()


class _TensorExtent:
    """The tensor whose bytes' place the core asks at wait() (its
    Staging::current_extent, through the tensor's C methods only)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor


def _describe_tensor(t):
    device = t.device
    kind = device.type
    index = device.index if device.index is not None else -1
    # Sparse layouts have no one block of bytes: refused as storage-less.
    has_storage = kind != "meta" and str(t.layout) == "torch.strided"
    nbytes = t.numel() * t.element_size()
    ptr = 0
    hold = t
    if has_storage:
        try:
            ptr, nbytes = _tensor_address(t)
            # The storage too: if the tensor is given another storage
            # mid-flight, the memory the op was given stays allocated.
            hold = (t, t.untyped_storage())
        except (RuntimeError, NotImplementedError):  # fake and other storage-less tensors
            has_storage = False
    contiguous = bool(t.is_contiguous())
    pinned = kind == "cpu" and bool(t.is_pinned())
    dim0 = t.size(0) if t.dim() > 0 else 0
    host_direct = kind == "cpu" and contiguous
    copier = None if host_direct or not has_storage else _TensorCopier(t)
    extent = _TensorExtent(t) if host_direct and has_storage else None
    return Description(ptr, nbytes, t.element_size(), dim0, kind, index, contiguous, pinned, has_storage, hold, copier, extent)


def _c_strides(shape, itemsize):
    strides = []
    step = itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def _refuse_references(obj, what, holds):
    """A TypeError unless the object's items are plain data: an item that
    holds a reference (numpy dtype 'O', a structured dtype with such a
    field, buffer format 'O') is a pointer to a Python object, and its
    bytes are neither data to write to a file nor anything a read may
    overwrite (the next refcount change would follow the file's bytes)."""
    if holds:
        raise TypeError(f"{what}: the {type(obj).__name__}'s items hold references to Python objects "
                        "(an object or structured dtype with object fields), whose bytes are addresses, not data; "
                        "pass an array of plain numbers or bytes")


def _descr_holds_objects(descr):
    """Whether an __array_interface__ typestr or descr names an object field."""
    if isinstance(descr, str):
        return descr[1:2] == "O"
    if isinstance(descr, (list, tuple)):
        for field in descr:
            if isinstance(field, (list, tuple)) and len(field) >= 2 and _descr_holds_objects(field[1]):
                return True
    return False


def _format_holds_objects(fmt):
    """Whether a buffer-protocol (struct) format has an object item ('O'),
    ignoring field names (':name:') inside structures."""
    plain = []
    in_name = False
    for ch in fmt:
        if ch == ":":
            in_name = not in_name
        elif not in_name:
            plain.append(ch)
    return "O" in plain


class _ArrayExtent:
    """The array whose bytes' place the core asks at wait() (its
    Staging::current_extent, through ndarray's C array interface)."""

    __slots__ = ("array", "itemsize")

    def __init__(self, array, itemsize):
        self.array, self.itemsize = array, itemsize


_TYPESTR = re.compile(r"^[<>|=]?([a-zA-Z])(\d+)")


def _itemsize(obj, typestr, what):
    """An item's bytes: the dtype's own answer, else the typestr's
    (whose number counts characters, not bytes, for unicode)."""
    size = getattr(getattr(obj, "dtype", None), "itemsize", None)
    if isinstance(size, int) and size > 0:
        return size
    m = _TYPESTR.match(typestr or "")
    if not m:
        raise TypeError(f"{what}: cannot tell the item size of array interface typestr {typestr!r}")
    return int(m.group(2)) * (4 if m.group(1) == "U" else 1)


def _describe_array(obj, ai, into, what):
    dtype = getattr(obj, "dtype", None)
    _refuse_references(obj, what, bool(getattr(dtype, "hasobject", False)) or _descr_holds_objects(ai.get("typestr"))
                       or _descr_holds_objects(ai.get("descr")))
    data = ai.get("data")
    if not isinstance(data, tuple):  # data given as a buffer object: use the buffer path
        return None
    ptr, readonly = data
    if readonly and into:
        raise TypeError(f"{what}: cannot read into a read-only {type(obj).__name__} (its memory is not writable); "
                        "pass a writable array")
    if into and "__ref" in ai:
        # A numpy scalar describes a temporary copy of itself: bytes read
        # there would be dropped.
        raise TypeError(f"{what}: cannot read into a numpy scalar ({type(obj).__name__}: its bytes are a temporary "
                        "copy); pass an array, e.g. arr[i:i + 1]")
    shape = tuple(ai.get("shape", ()))
    itemsize = _itemsize(obj, ai.get("typestr"), what)
    count = 1
    for extent in shape:
        count *= extent
    strides = ai.get("strides")
    contiguous = strides is None or count == 0 or tuple(strides) == _c_strides(shape, itemsize)
    dim0 = shape[0] if shape else 0
    copier = None if contiguous else _ArrayCopier(obj)
    # A scalar's temporary lives as long as its interface dict.
    hold = (obj, ai) if "__ref" in ai else obj
    extent = _ArrayExtent(obj, itemsize) if contiguous and "__ref" not in ai else None
    return Description(ptr or 0, count * itemsize, itemsize, dim0, "cpu", -1, contiguous, False, True, hold, copier, extent)


def _describe_buffer(obj, into, what):
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"{what}: expected a torch tensor, a numpy array or an object with the buffer protocol "
            f"(bytearray, memoryview, mmap, ...); got {type(obj).__name__}"
        ) from None
    _refuse_references(obj, what, _format_holds_objects(view.format))
    if not view.c_contiguous:
        raise ValueError(f"{what}: the {type(obj).__name__} is not C-contiguous; pass a contiguous buffer")
    nbytes = view.nbytes
    itemsize = view.itemsize
    dim0 = view.shape[0] if view.ndim else 0
    flat = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    if view.readonly:
        if into:
            raise TypeError(
                f"{what}: cannot read into a read-only buffer ({type(obj).__name__}); "
                "pass a writable one (bytearray, a writable memoryview, mmap, numpy array, torch tensor)"
            )
        # Written from, never into: a private copy is as good, and gives an address.
        hold = (ctypes.c_char * nbytes).from_buffer_copy(flat)
    else:
        # Holds the buffer export until the op lets go of it: the object
        # cannot be resized, closed or freed under the I/O.
        hold = (ctypes.c_char * nbytes).from_buffer(flat)
    return Description(ctypes.addressof(hold), nbytes, itemsize, dim0, "cpu", -1, True, False, True, hold, None, None)


def describe(obj, into, what="buffer"):
    """The description of `obj` for an op that writes into it (`into`: a
    read) or reads from it; `what` names the call in errors."""
    if _is_tensor(obj):
        return _describe_tensor(obj)
    ai = getattr(obj, "__array_interface__", None)
    if isinstance(ai, dict):
        described = _describe_array(obj, ai, into, what)
        if described is not None:
            return described
    return _describe_buffer(obj, into, what)


def locked_object(memory, num_elem, example):
    """The object `new_cpu_locked_tensor` returns over `memory` (the Rust
    `LockedMemory`, which frees the region when the last reference goes):
    a torch tensor of the example's dtype when the example is a torch
    tensor (or is not an array and torch is importable), else a numpy array.
    The returned object keeps `memory` alive through its buffer."""
    nbytes = memory.nbytes
    raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(memory.address)
    raw._deepnvme_memory = memory  # ctypes arrays take attributes; the view keeps its owner
    use_numpy = isinstance(getattr(example, "__array_interface__", None), dict)
    if not use_numpy and not _is_tensor(example):
        try:
            import torch  # noqa: F401
        except ImportError:
            use_numpy = True
    if use_numpy:
        import numpy

        dtype = getattr(example, "dtype", numpy.uint8)
        return numpy.frombuffer(raw, dtype=numpy.uint8, count=nbytes).view(dtype)
    import torch

    dtype = example.dtype if _is_tensor(example) else torch.uint8
    if nbytes == 0:
        # torch.frombuffer refuses an empty buffer; a view of zero elements
        # still points at the (one-page) allocation.
        return torch.frombuffer(raw, dtype=torch.uint8)[:0].view(dtype)
    return torch.frombuffer(raw, dtype=dtype, count=num_elem)
