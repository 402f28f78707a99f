"""Stripe sets for the Python tests: member folders on fresh loop devices
(ext4, direct I/O over sparse files), the set declared as `deepnvme stripe
create` declares it (a marker in each member, then the manifest in the
folder: the format docs/striping.md gives), and a striped file's bytes read
from its member files with this file's own arithmetic.

Not zram: this kernel's zram accepts O_DIRECT writes from memory that is
512-aligned but not page-aligned, and stores the page-rounded bytes instead
(docs/striping.md)."""

import errno
import os
import shutil
import subprocess

MANIFEST = ".deepnvme-stripe"
MARKER = ".deepnvme-stripe-member"
KIB, MIB = 1 << 10, 1 << 20


def _run(*cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout


class Device:
    """ext4 on a loop device (direct I/O, over a sparse file), mounted;
    removed by close()."""

    def __init__(self, mount, image, size=512 << 20):
        self.mount, self.dev, self.mounted = mount, None, False
        with open(image, "wb") as f:
            f.truncate(size)
        self.dev = _run("losetup", "--find", "--show", "--direct-io=on", image).strip()
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", self.dev)
        os.makedirs(mount, exist_ok=True)
        _run("mount", "-o", "noatime", self.dev, mount)
        self.mounted = True

    def close(self):
        if self.mounted:
            subprocess.run(["umount", self.mount], capture_output=True)
        if self.dev:
            subprocess.run(["losetup", "-d", self.dev], capture_output=True)


def cannot_make_devices():
    """Why this machine cannot make the devices, or None."""
    if os.geteuid() != 0:
        return "not root (losetup, mkfs.ext4 and mount need it)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop driver (/dev/loop-control)"
    for tool in ("mkfs.ext4", "losetup"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def declare(root, members, unit):
    """What `deepnvme stripe create` writes: markers, then the manifest."""
    set_id = os.urandom(8).hex()
    os.makedirs(root, exist_ok=True)
    for i, m in enumerate(members):
        os.makedirs(m, exist_ok=True)
        with open(os.path.join(m, MARKER), "w") as f:
            f.write(f"format = 1\nid = {set_id}\nindex = {i}\ncount = {len(members)}\nset = {root}\n")
    with open(os.path.join(root, MANIFEST), "w") as f:
        f.write(f"format = 1\nid = {set_id}\nunit = {unit}\n" + "".join(f"member = {m}\n" for m in members))


class StripeSet:
    """A declared set on `count` fresh devices under `base`; close() removes them."""

    def __init__(self, base, count, unit):
        self.devices = []
        try:
            for i in range(count):
                self.devices.append(Device(os.path.join(base, f"dev{i}"), os.path.join(base, f"disk{i}.img")))
        except BaseException:
            self.close()
            raise
        self.members = [os.path.join(d.mount, "stripe") for d in self.devices]
        self.root = os.path.join(base, "nvme")
        self.unit = unit
        declare(self.root, self.members, unit)

    def close(self):
        for d in self.devices:
            d.close()

    def path(self, rel):
        return os.path.join(self.root, rel)

    def is_striped(self, rel):
        try:
            os.getxattr(self.path(rel), "user.deepnvme.stripe")
            return True
        except OSError:
            return False

    def holds_data(self, rel):
        """Whether the placeholder has any data (not its mark: a long mark
        may take a block of its own, which SEEK_DATA does not count)."""
        fd = os.open(self.path(rel), os.O_RDONLY)
        try:
            os.lseek(fd, 0, os.SEEK_DATA)
            return True
        except OSError as e:
            if e.errno == errno.ENXIO:
                return False
            raise
        finally:
            os.close(fd)

    def extent(self, rel):
        value = os.getxattr(self.path(rel), "user.deepnvme.stripe")
        return int(value.split(b" ", 3)[2])

    def member_rel(self, rel):
        value = os.getxattr(self.path(rel), "user.deepnvme.stripe")
        return os.fsdecode(value.split(b" ", 3)[3])

    def logical(self, rel):
        """The file's bytes from its member files (and the placeholder past
        the striped extent), read with plain reads."""
        size = os.path.getsize(self.path(rel))
        extent = min(self.extent(rel), size)
        member_rel = self.member_rel(rel)
        n = len(self.members)
        out = bytearray(size)
        files = [open(os.path.join(m, member_rel), "rb") for m in self.members]
        try:
            for k, start in enumerate(range(0, extent, self.unit)):
                f = files[k % n]
                f.seek((k // n) * self.unit)
                chunk = f.read(min(self.unit, extent - start))
                out[start:start + len(chunk)] = chunk
        finally:
            for f in files:
                f.close()
        if size > extent:
            with open(self.path(rel), "rb") as f:
                f.seek(extent)
                out[extent:] = f.read()
        return bytes(out)


def cli_binary():
    """The deepnvme CLI, built by cargo (None where cargo is missing, as in
    the wheel check's compiler-less venv)."""
    import json

    if shutil.which("cargo") is None:
        return None
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(["cargo", "build", "-q", "-p", "deepnvme-cli", "--bin", "deepnvme", "--message-format=json"],
                          cwd=root, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == "deepnvme":
            return msg["executable"]
    raise RuntimeError("cargo reported no deepnvme executable")
