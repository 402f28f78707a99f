# Type stubs of deepnvme.frontend (the pyo3 front end's Python face).
from deepnvme._native import (
    aio_handle as aio_handle,
    aio_read as aio_read,
    aio_write as aio_write,
    deepspeed_memcpy as deepspeed_memcpy,
    gds_handle as gds_handle,
    pin_handle as pin_handle,
)

__all__ = ["aio_handle", "aio_read", "aio_write", "deepspeed_memcpy", "gds_handle", "pin_handle"]

FRONTEND: str
