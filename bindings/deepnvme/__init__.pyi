# Type stubs of the deepnvme package (bindings/deepnvme/__init__.py).
# DeepSpeed's op API at the top level is deepnvme.frontend's (the pyo3 front
# end), imported on first use. Checked by mypy's stubtest (tests/wheel-check.sh).
from types import ModuleType
from os import PathLike
from typing import Any, Callable, Iterable, Optional, Union

from deepnvme._native import (
    _Stats,
    aio_handle as aio_handle,
    aio_read as aio_read,
    aio_write as aio_write,
    deepspeed_memcpy as deepspeed_memcpy,
    gds_handle as gds_handle,
    pin_handle as pin_handle,
)

__version__: str
_Path = Union[str, PathLike[str]]

FRONTEND_API: tuple[str, ...]
COPY_API: tuple[str, ...]
OPS: tuple[str, ...]
OPS_ENV: str
FRONTEND_ENV: str
FRONTENDS: tuple[str, ...]
__all__ = [
    "DeepNVMeWarning", "OPS", "FRONTEND_ENV", "choose_frontend", "load_op", "op_unavailable_reason", "native", "stats",
    "provided_ops", "include_dir", "library_dir", "libraries", "copy2", "copytree", "aio_handle", "pin_handle", "gds_handle", "aio_read",
    "aio_write", "deepspeed_memcpy",
]

class DeepNVMeWarning(UserWarning): ...

def native() -> ModuleType: ...
def stats() -> _Stats: ...
def load_op(name: str) -> ModuleType: ...
def load_pin_memory_for_stock_ops() -> ModuleType: ...
def op_unavailable_reason(name: str) -> Optional[str]: ...
def provided_ops(value: Optional[str] = None) -> tuple[str, ...]: ...
def include_dir() -> str: ...
def library_dir() -> str: ...
def libraries() -> list[str]: ...
def copy2(src: _Path, dst: _Path, *, follow_symlinks: bool = True) -> _Path: ...
def copytree(
    src: _Path,
    dst: _Path,
    symlinks: bool = False,
    ignore: Optional[Callable[[Any, list[str]], Iterable[str]]] = None,
    copy_function: Callable[..., object] = ...,
    ignore_dangling_symlinks: bool = False,
    dirs_exist_ok: bool = False,
) -> _Path: ...
def build_info() -> Optional[dict[str, object]]: ...
def torch_abi() -> Optional[dict[str, object]]: ...
def choose_frontend() -> tuple[str, str]: ...
