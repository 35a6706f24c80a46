"""The daemon's OCI images: ``client.images``."""

from __future__ import annotations

import os
from typing import IO, Any, Callable, Dict, List, Optional, Union

from . import _proto
from ._dockerctx import pack_context
from ._transport import Transport, b64encode
from .errors import NotFoundError, PermissionDeniedError, error_from_code
from .recipe import Recipe
from .types import ImageInfo, ImageProgress

__all__ = ["Images"]

_SERVICE = "sbx.v1.ImageService"

PathOrFile = Union[str, "os.PathLike[str]", IO[bytes]]


class Images:
    """Manage the daemon's images. Obtain it as :attr:`Client.images`.

    References are normalised like docker's: ``"alpine"`` is
    ``"index.docker.io/library/alpine:latest"``.
    """

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def pull(self, ref: str, progress: Optional[Callable[[ImageProgress], None]] = None) -> ImageInfo:
        """Fetch ``ref`` from its registry. ``progress``, if given, is called
        with every :class:`~sbx.ImageProgress` event as it arrives. Returns the
        pulled image."""
        with self._t.server_stream(_SERVICE, "PullImage", {"ref": ref}, op=f"pull {ref}") as stream:
            for msg in stream:
                ev = ImageProgress.from_json(msg)
                if progress is not None:
                    progress(ev)
                if ev.kind == "done" and ev.done is not None:
                    return ev.done
        raise error_from_code("unavailable", "pull ended before the image was done", op=f"pull {ref}")

    def list(self) -> List[ImageInfo]:
        """Every stored image."""
        resp = self._t.unary(_SERVICE, "ListImages", {}, op="list images")
        return [ImageInfo.from_json(i) for i in resp.get("images") or []]

    def disk_usage(self) -> int:
        """Bytes all unpacked layers take on disk (shared layers counted once)."""
        resp = self._t.unary(_SERVICE, "ListImages", {}, op="list images")
        return int(resp.get("layersBytes") or 0)

    def get(self, ref: str) -> ImageInfo:
        """Describe one image (by reference or digest).

        Raises:
            NotFoundError: no such image.
        """
        resp = self._t.unary(_SERVICE, "GetImage", {"ref": ref}, op=f"get image {ref}")
        return ImageInfo.from_json(resp.get("image") or {})

    def tag(self, source: str, target: str) -> None:
        """Give image ``source`` another reference ``target``."""
        self._t.unary(_SERVICE, "TagImage", {"source": source, "target": target}, op=f"tag {source}")

    def remove(self, ref: str) -> None:
        """Untag an image; :meth:`prune` then frees its layers."""
        self._t.unary(_SERVICE, "RemoveImage", {"ref": ref}, op=f"remove image {ref}")

    def prune(self) -> int:
        """Delete layers no image or sandbox uses; returns the bytes freed."""
        resp = self._t.unary(_SERVICE, "PruneImages", {}, op="prune images")
        return int(resp.get("freedBytes") or 0)

    def import_tar(
        self,
        source: PathOrFile,
        tag: str = "",
        *,
        use_archive_tags: bool = False,
        replace_archive_tags: bool = False,
    ) -> List[ImageInfo]:
        """Import a docker-save or OCI-layout tarball (a path or a binary file).
        ``tag`` optionally names a single-image archive (it must be a valid
        image reference). The names inside the archive (RepoTags, OCI
        annotations) are chosen by its author and are not applied unless
        ``use_archive_tags``; then each must be valid, and one that names
        another image already fails the import unless
        ``replace_archive_tags``. Returns the images."""
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                return self.import_tar(
                    f, tag, use_archive_tags=use_archive_tags, replace_archive_tags=replace_archive_tags
                )
        fileobj = source

        header: Dict[str, Any] = {}
        if tag:
            header["tag"] = tag
        if use_archive_tags:
            header["useArchiveTags"] = True
        if replace_archive_tags:
            header["replaceArchiveTags"] = True
        resp = self._t.upload_stream(
            _SERVICE, "ImportImage", header, fileobj,
            _proto.IMPORT_IMAGE_REQUEST, _proto.IMPORT_IMAGE_RESPONSE, op="import image",
        )
        return [ImageInfo.from_json(i) for i in resp.get("images") or []]

    def export(self, ref: str, dest: PathOrFile) -> int:
        """Write image ``ref`` as a docker-save tarball to ``dest`` (a path or
        a binary file). Returns the bytes written."""
        if isinstance(dest, (str, os.PathLike)):
            path = os.fspath(dest)
            tmp = path + ".sbx-partial"
            try:
                with open(tmp, "wb") as f:
                    n = self.export(ref, f)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return n
        with self._t.data_stream(
            _SERVICE, "ExportImage", {"ref": ref}, _proto.EXPORT_IMAGE_REQUEST, op=f"export {ref}"
        ) as stream:
            return stream.copy_to(dest)

    def ensure(self, ref: str, progress: Optional[Callable[[ImageProgress], None]] = None) -> Optional[ImageInfo]:
        """Make sure ``ref`` is in the daemon's store, pulling it (with
        ``progress``) if it is not, and return it. Creating a sandbox from a
        missing image pulls it anyway; ``ensure`` first is how a caller sees
        the pull's progress. Returns None for ``"host"`` and ``""`` (the
        built-in image) and for a token that may not see images (a scoped
        sandbox token)."""
        if ref in ("", "host"):
            return None
        try:
            return self.get(ref)
        except PermissionDeniedError:
            return None
        except NotFoundError:
            return self.pull(ref, progress)

    def build(
        self,
        recipe: Union[Recipe, Dict[str, Any], None] = None,
        tag: str = "",
        *,
        dockerfile: Union[str, "os.PathLike[str]", None] = None,
        context: Union[str, "os.PathLike[str]", None] = None,
        build_args: Optional[Dict[str, str]] = None,
        no_cache: bool = False,
        progress: Optional[Callable[[ImageProgress], None]] = None,
    ) -> ImageInfo:
        """Build ``recipe`` (a :class:`~sbx.Recipe` or its JSON form), or a
        Dockerfile, one sandbox per step, each step cached; tag the result
        ``tag``. ``progress`` gets every event: ``"step"``
        (running/cached/done), ``"log"`` (the step's output) and
        ``"status"``. Returns the image.

        ``dockerfile`` is the path of a Dockerfile (as llm-sandbox takes it);
        its build context is ``context``, by default the Dockerfile's
        directory, sent without what its ``.dockerignore`` lists (at most
        46 MiB; symlinks as links). ``build_args`` set its ARGs. Supported:
        FROM, RUN, COPY, ADD (local files), ENV, ARG, WORKDIR, USER,
        ENTRYPOINT, CMD; LABEL, EXPOSE, MAINTAINER and STOPSIGNAL are
        accepted; anything else fails naming its line.

        Raises:
            InvalidArgumentError: a bad recipe or Dockerfile.
            FailedPreconditionError: a step failed (the message names it and
                ends with its output).
        """
        req: Dict[str, Any] = {}
        if dockerfile is not None:
            if recipe is not None:
                raise ValueError("build: give a recipe or a dockerfile, not both")
            path = os.fspath(dockerfile)
            with open(path, encoding="utf-8") as f:
                req["dockerfile"] = f.read()
            ctx_dir = os.fspath(context) if context is not None else (os.path.dirname(os.path.abspath(path)))
            req["context"] = b64encode(pack_context(ctx_dir))
            if build_args:
                req["buildArgs"] = dict(build_args)
        else:
            if recipe is None:
                raise ValueError("build: give a recipe or a dockerfile")
            if context is not None or build_args:
                raise ValueError("build: context and build_args go with a dockerfile")
            req["recipe"] = recipe.to_json() if isinstance(recipe, Recipe) else Recipe.from_dict(recipe).to_json()
        if tag:
            req["tag"] = tag
        if no_cache:
            req["noCache"] = True
        with self._t.server_stream(_SERVICE, "BuildImage", req, op=f"build {tag or 'image'}") as stream:
            for msg in stream:
                ev = ImageProgress.from_json(msg)
                if progress is not None:
                    progress(ev)
                if ev.kind == "done" and ev.done is not None:
                    return ev.done
        raise error_from_code("unavailable", "build ended before the image was done", op="build")
