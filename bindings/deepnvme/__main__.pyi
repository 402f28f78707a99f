# Type stubs of the `deepnvme` console script (bindings/deepnvme/__main__.py).
from collections.abc import Sequence
from typing import Optional

PYTHON_ENV: str
COULD_NOT_RUN: int

def binary() -> str: ...
def main(argv: Optional[Sequence[str]] = None) -> int: ...
