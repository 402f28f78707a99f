"""The `deepnvme` command (the console script) and `python -m deepnvme`:
doctor, bench, tune and info.

Both run the CLI binary shipped in the package (deepnvme/_bin/deepnvme,
built from crates/deepnvme-cli with the core): the process becomes that
binary (exec), so the output, `--json` and the exit status are the
cargo-built CLI's, with no second implementation to keep in step. The
binary is told which Python it was started from, so that `deepnvme doctor`
checks this interpreter's torch, DeepSpeed and deepnvme unless `--python`
names another.
"""

import os
import sys

#: The interpreter the doctor probes by default (read by the CLI; private).
PYTHON_ENV = "DEEPNVME_CLI_PYTHON"
#: The exit status of a CLI that could not run (as the CLI's own).
COULD_NOT_RUN = 2


def binary():
    """The path of the CLI binary in this package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "deepnvme")


def main(argv=None):
    exe = binary()
    if not os.access(exe, os.X_OK):
        print(f"deepnvme: this install has no CLI binary ({exe}): the compiled build (bindings/setup.py) "
              f"ships none; run `cargo run --release -- {' '.join(sys.argv[1:] if argv is None else argv)}` "
              f"in the checkout, or install the wheel (`pip install deepnvme`)", file=sys.stderr)
        return COULD_NOT_RUN
    args = sys.argv[1:] if argv is None else list(argv)
    env = dict(os.environ)
    env.setdefault(PYTHON_ENV, sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(exe, ["deepnvme", *args], env)


if __name__ == "__main__":
    sys.exit(main())
