"""The small local image mlchaos's Docker testbed (and Docker tests) run: built without any registry.

The image is a skeleton root filesystem (``/proc``, ``/dev``, ``/etc/passwd`` …, and the merged-/usr
symlinks ``/bin -> usr/bin`` etc.) imported with ``docker import``; containers get this machine's ``/usr``
bind-mounted read-only (shell, coreutils, Python, iptables, iproute2) plus the Python environment mlchaos
runs from (:func:`python_binds`), also read-only. So the image is a few KB, builds in well under a second,
and needs no network. Every image carries the label ``mlchaos.testbed=1`` so ``down`` can find its own.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import docker

IMAGE_REPOSITORY = "mlchaos-testbed"
IMAGE_TAG = "1"
IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"
LABEL = "mlchaos.testbed"

_DIRS = ("proc", "sys", "dev", "etc", "tmp", "run", "root", "usr", "var", "var/tmp", "home", "opt", "mnt")
_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
_FILES = ("/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/protocols", "/etc/services")


def rootfs_tar() -> bytes:
    """The skeleton root filesystem as an uncompressed tar (deterministic apart from copied /etc files)."""
    buffer = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in _DIRS:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if name in ("tmp", "var/tmp") else 0o755, now
            tar.addfile(info)
        for name, target in _LINKS.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, now
            tar.addfile(info)
        for path in _FILES:
            if os.path.exists(path):
                data = Path(path).read_bytes()
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size, info.mode, info.mtime = len(data), 0o644, now
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def ensure_image(client: docker.DockerClient) -> str:
    """Import :data:`IMAGE` unless the daemon already has it; returns its name. Idempotent."""
    import docker.errors

    try:
        client.images.get(IMAGE)
        return IMAGE
    except docker.errors.ImageNotFound:
        pass
    client.api.import_image_from_data(
        rootfs_tar(), repository=IMAGE_REPOSITORY, tag=IMAGE_TAG, changes=[f"LABEL {LABEL}=1"]
    )
    client.images.get(IMAGE)  # raises if the import did not produce it
    return IMAGE


def python_binds() -> dict[str, dict[str, str]]:
    """Read-only binds that make this machine's Python environment (interpreter, venv, the project when
    installed editable) work inside a container of :data:`IMAGE`, in docker SDK ``volumes=`` form."""
    paths = {"/usr", "/etc/alternatives"}  # Debian's /usr/sbin/iptables links through /etc/alternatives
    for candidate in (sys.prefix, sys.base_prefix, os.path.realpath(sys.executable)):
        paths.add(str(Path(candidate).resolve()))
    project = Path(__file__).resolve().parents[2]  # the checkout mlchaos runs from (editable installs)
    paths.add(str(project))
    # Keep only outermost paths: binding /a and /a/b would shadow nothing but costs a mount each.
    kept: list[str] = []
    for path in sorted(paths, key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return {path: {"bind": path, "mode": "ro"} for path in kept if os.path.exists(path)}
