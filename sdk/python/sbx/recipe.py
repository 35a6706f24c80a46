"""Builder recipes: an image described as a base plus steps, built by the
daemon with a per-step cache (``client.images.build``)."""

from __future__ import annotations

import io
import os
import tarfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._tar import pack_dir
from ._transport import b64encode

__all__ = ["Recipe"]

_MAX_COPY = 64 << 20


class Recipe:
    """An image recipe, built step by step like a Dockerfile; every method
    returns the recipe, so calls chain::

        recipe = (
            sbx.Recipe("debian:bookworm")
            .apt_install("python3", "python3-numpy")
            .env(PYTHONUNBUFFERED="1")
            .copy_local("./app", "/app")
            .workdir("/app")
            .run("python3 -c 'import numpy'")
        )
        image = client.images.build(recipe, tag="localhost/my/app:v1")

    Each step becomes a layer cached by the hash of its parent and the step,
    so rebuilding after changing the last step reruns only that step.

    Args:
        base: ``"debian:bookworm"`` (made locally from Debian's mirror),
            ``"host"`` or any image reference.
    """

    def __init__(self, base: str = "debian:bookworm") -> None:
        if not base:
            raise ValueError("recipe: base image must not be empty")
        self.base = base
        self._steps: List[Dict[str, Any]] = []

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "Recipe":
        """A recipe from its JSON form (``{"from": ..., "steps": [...]}``, the
        protojson of ``sbx.v1.Recipe``, e.g. a parsed recipe file)."""
        r = cls(str(obj.get("from") or "debian:bookworm"))
        for step in obj.get("steps") or []:
            if not isinstance(step, Mapping) or len(step) != 1:
                raise ValueError(f"recipe step {step!r}: want exactly one key")
            r._steps.append(dict(step))
        return r

    def _add(self, key: str, value: Any) -> "Recipe":
        self._steps.append({key: value})
        return self

    @staticmethod
    def _packages(kind: str, packages: Sequence[str]) -> Dict[str, Any]:
        pkgs = [p for p in packages]
        if not pkgs or any(not isinstance(p, str) or not p.strip() for p in pkgs):
            raise ValueError(f"{kind}: want one or more package names, got {pkgs!r}")
        return {"packages": pkgs}

    def apt_install(self, *packages: str) -> "Recipe":
        """Install Debian packages with apt-get."""
        return self._add("aptInstall", self._packages("apt_install", packages))

    def pip_install(self, *packages: str) -> "Recipe":
        """Install Python packages with pip."""
        return self._add("pipInstall", self._packages("pip_install", packages))

    def npm_install(self, *packages: str) -> "Recipe":
        """Install npm packages globally."""
        return self._add("npmInstall", self._packages("npm_install", packages))

    def run(self, command: str) -> "Recipe":
        """Run a shell command line (``/bin/sh -c``)."""
        if not command or not command.strip():
            raise ValueError("run: empty command")
        return self._add("run", command)

    def env(self, values: Optional[Mapping[str, str]] = None, **kw: str) -> "Recipe":
        """Add variables to the image's environment."""
        merged = dict(values or {})
        merged.update(kw)
        if not merged:
            raise ValueError("env: no variables")
        return self._add("env", {"env": {str(k): str(v) for k, v in merged.items()}})

    def workdir(self, path: str) -> "Recipe":
        """Set the working directory of later steps and of the image."""
        return self._add("workdir", path)

    def user(self, user: str) -> "Recipe":
        """Set the user of later steps and of the image."""
        return self._add("user", user)

    def python(self, version: str) -> "Recipe":
        """Install Python ``version`` ("3.11") from the image's apt sources
        (``python3.X``, its venv module and Debian's pip) and point
        ``python3`` and ``python`` in /usr/local/bin at it. Debian bookworm
        packages 3.11 only; a version the sources lack fails the step, which
        names the versions they have."""
        if not isinstance(version, str) or not version.startswith("3."):
            raise ValueError(f"python: want a version like '3.11', got {version!r}")
        return self._add("python", version)

    def entrypoint(self, *argv: str) -> "Recipe":
        return self._add("entrypoint", {"values": list(argv)})

    def cmd(self, *argv: str) -> "Recipe":
        return self._add("cmd", {"values": list(argv)})

    def copy_local(self, local_path: Union[str, "os.PathLike[str]"], dest: str) -> "Recipe":
        """Copy a local file or directory into the image at ``dest`` (the
        directory's contents go into ``dest``). The files are packed now,
        so later changes to them do not affect this recipe."""
        path = os.fspath(local_path)
        buf = io.BytesIO()
        if os.path.isdir(path):
            pack_dir(path, buf)
        elif os.path.isfile(path):
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
                ti = tf.gettarinfo(path, arcname=os.path.basename(path))
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                with open(path, "rb") as f:
                    tf.addfile(ti, f)
        else:
            raise FileNotFoundError(f"copy_local: {path}: no such file or directory")
        if buf.tell() > _MAX_COPY:
            raise ValueError(f"copy_local: {path} packs to {buf.tell()} bytes, more than {_MAX_COPY}; use a volume or codebase")
        return self._add("copy", {"dest": dest, "tar": b64encode(buf.getvalue())})

    @property
    def steps(self) -> List[Dict[str, Any]]:
        """The steps in their JSON form."""
        return [dict(s) for s in self._steps]

    def to_json(self) -> Dict[str, Any]:
        """The protojson form of the recipe."""
        return {"from": self.base, "steps": self.steps}

    def __repr__(self) -> str:
        return f"sbx.Recipe({self.base!r}, {len(self._steps)} steps)"
