"""deepnvme's informational lines as records of the ``deepnvme`` logger.

The Rust core hands each line to ``emit`` from a thread of its own
(src/rt/log_queue.rs), from either front end. By default they print on stderr
as ``deepnvme: <line>`` at INFO, as before; once the application configures
logging (a handler on the root logger or on ``deepnvme``), they go to its
handlers instead. To silence them::

    logging.getLogger("deepnvme").setLevel(logging.WARNING)

``DEEPNVME_LOG=quiet`` still drops them in the core. Errors the caller gets
as return codes (-1) print on stderr whatever the logger says.
"""

import logging
import sys

LOGGER_NAME = "deepnvme"
logger = logging.getLogger(LOGGER_NAME)


class _StderrUnlessConfigured(logging.Handler):
    """Prints on stderr (looked up at each line, so redirections count)
    while no other handler would show the record."""

    def emit(self, record):
        if _other_handlers():
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _other_handlers():
    current = logger
    while current is not None:
        if any(h is not _HANDLER for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


_HANDLER = _StderrUnlessConfigured()
_HANDLER.setFormatter(logging.Formatter("deepnvme: %(message)s"))
logger.addHandler(_HANDLER)
if logger.level == logging.NOTSET:
    logger.setLevel(logging.INFO)


def emit(line):
    """Logs one informational line of the core."""
    logger.info(line)
