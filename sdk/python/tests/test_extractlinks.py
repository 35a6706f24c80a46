"""safe_extract into a directory that already holds the user's own links
(p -> a directory outside it): the archive's l -> p/x reads as inside on its
own but leads out, so it is not made (it is listed as skipped); a link
through an existing link that stays inside, and a dangling one, are kept.
(The same case the CLI and the TypeScript SDK got wrong; Python resolves
each link's target with realpath when it is made.)"""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from sbx._tar import safe_extract


@pytest.mark.parametrize("existing", ["absolute", "../outside"])
def test_link_through_existing_link(tmp_path, existing) -> None:
    dst, outside = tmp_path / "dst", tmp_path / "outside"
    (dst / "in").mkdir(parents=True)
    outside.mkdir()
    os.symlink(str(outside) if existing == "absolute" else "../outside", dst / "p")
    os.symlink("in", dst / "q")
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w") as tf:
        for name, link in [("l", "p/x"), ("m", "q/y"), ("dangling", "nothing/here")]:
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname = tarfile.SYMTYPE, link
            tf.addfile(ti)
    b.seek(0)
    skipped: list = []
    safe_extract(b, str(dst), skipped=skipped)
    assert skipped == ["l -> p/x"]
    assert not os.path.lexists(dst / "l")
    assert os.readlink(dst / "m") == "q/y"
    assert os.readlink(dst / "dangling") == "nothing/here"
