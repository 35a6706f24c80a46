"""Files: read/write round trips, metadata, directories via tar, safe extraction."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

import sbx


def test_write_read_round_trip(shared_sandbox: sbx.Sandbox) -> None:
    f = shared_sandbox.files
    assert f.write("/root/rt/a/b/hello.txt", "héllo\n") == len("héllo\n".encode())
    assert f.read("/root/rt/a/b/hello.txt") == "héllo\n".encode()
    assert f.read_text("/root/rt/a/b/hello.txt") == "héllo\n"
    assert shared_sandbox.run("cat /root/rt/a/b/hello.txt").stdout == "héllo\n"
    # Written by a command, read by the SDK.
    shared_sandbox.run("printf 'from shell' > /root/rt/shell.txt", raise_on_error=True)
    assert f.read("/root/rt/shell.txt") == b"from shell"
    # Append, offset and length.
    f.write("/root/rt/log.txt", b"one\n")
    f.write("/root/rt/log.txt", b"two\n", append=True)
    assert f.read("/root/rt/log.txt") == b"one\ntwo\n"
    assert f.read("/root/rt/log.txt", offset=4) == b"two\n"
    assert f.read("/root/rt/log.txt", offset=1, length=2) == b"ne"
    # Empty file.
    f.write("/root/rt/empty", b"")
    assert f.read("/root/rt/empty") == b""


def test_large_file(shared_sandbox: sbx.Sandbox, tmp_path) -> None:
    data = os.urandom(5 << 20)
    f = shared_sandbox.files
    assert f.write("/root/big.bin", data) == len(data)
    assert f.stat("/root/big.bin").size == len(data)
    assert f.read("/root/big.bin") == data
    r = shared_sandbox.run("sha256sum /root/big.bin")
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    # From and to local files, streamed.
    local = tmp_path / "big.bin"
    local.write_bytes(data)
    assert f.upload_file(str(local), "/root/big2.bin") == len(data)
    out = tmp_path / "back.bin"
    assert f.download_file("/root/big2.bin", str(out)) == len(data)
    assert out.read_bytes() == data
    f.remove("/root/big.bin")
    f.remove("/root/big2.bin")


def test_random_bytes_round_trip_every_path(shared_sandbox: sbx.Sandbox, tmp_path) -> None:
    # 12 MiB + an odd tail of random bytes (every byte value, no UTF-8 or
    # base64 alignment to hide behind) through each bulk path of the binary
    # codec, checked byte for byte and against the box's own sha256sum.
    import hashlib

    data = os.urandom((12 << 20) + 4099)
    want = hashlib.sha256(data).hexdigest()
    f = shared_sandbox.files

    def box_sha(path: str) -> str:
        return shared_sandbox.run(f"sha256sum {path}", raise_on_error=True).stdout.split()[0]

    assert f.write("/root/rand/a.bin", data) == len(data)
    assert box_sha("/root/rand/a.bin") == want
    assert f.read("/root/rand/a.bin") == data
    assert b"".join(f.iter_read("/root/rand/a.bin")) == data
    assert f.read("/root/rand/a.bin", offset=(5 << 20) + 1, length=3 << 20) == data[(5 << 20) + 1 : (8 << 20) + 1]
    # From a file object (read with readinto) and a memoryview.
    assert f.write("/root/rand/b.bin", io.BytesIO(data)) == len(data)
    assert f.write("/root/rand/c.bin", memoryview(data)) == len(data)
    assert box_sha("/root/rand/b.bin") == want and box_sha("/root/rand/c.bin") == want
    # To a path (sparse-aware) and to a file object.
    local = tmp_path / "rand.bin"
    assert f.download_file("/root/rand/b.bin", str(local)) == len(data)
    assert local.read_bytes() == data
    sink = io.BytesIO()
    assert f.download_file("/root/rand/c.bin", sink) == len(data)
    assert sink.getvalue() == data
    assert f.upload_file(str(local), "/root/rand/d.bin") == len(data)
    assert box_sha("/root/rand/d.bin") == want
    # Appending to it.
    assert f.write("/root/rand/d.bin", data[:1000], append=True) == 1000
    assert f.read("/root/rand/d.bin") == data + data[:1000]
    # As a tar, both ways.
    tar_bytes = f.download_tar("/root/rand/a.bin")
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tf:
        member = tf.extractfile("a.bin")
        assert member is not None and member.read() == data
    assert f.upload_tar("/root/rand2", tar_bytes) == {"files": 1, "bytes": len(data)}
    assert box_sha("/root/rand2/a.bin") == want
    f.remove("/root/rand", recursive=True)
    f.remove("/root/rand2", recursive=True)


def test_file_compression_round_trip(shared_sandbox: sbx.Sandbox, client: sbx.Client, tmp_path) -> None:
    # Asked for, gzip both ways: compressible and random bytes arrive intact.
    gz = sbx.Sandbox.from_id(shared_sandbox.id, client=sbx.Client(client.addr, timeout=120, file_compression=True))
    for name, data in (("text", b"a line of a log file\n" * 300_000), ("random", os.urandom((2 << 20) + 3))):
        assert gz.files.write(f"/root/gz-{name}", data) == len(data)
        assert shared_sandbox.files.read(f"/root/gz-{name}") == data
        assert gz.files.read(f"/root/gz-{name}") == data
        out = tmp_path / name
        assert gz.files.download_file(f"/root/gz-{name}", str(out)) == len(data)
        assert out.read_bytes() == data
    tar_bytes = gz.files.download_tar("/root/gz-text")
    assert gz.files.upload_tar("/root/gz-dir", tar_bytes)["files"] == 1
    assert shared_sandbox.files.read("/root/gz-dir/gz-text") == b"a line of a log file\n" * 300_000
    shared_sandbox.files.remove("/root/gz-dir", recursive=True)
    for name in ("text", "random"):
        shared_sandbox.files.remove(f"/root/gz-{name}")


def test_sparse_download_keeps_data(shared_sandbox: sbx.Sandbox, tmp_path) -> None:
    # Holes arrive as zeros and stay holes locally; data around them intact.
    shared_sandbox.run(
        "printf head > /root/sp && truncate -s 5M /root/sp && printf tail >> /root/sp", raise_on_error=True
    )
    out = tmp_path / "sp"
    n = shared_sandbox.files.download_file("/root/sp", str(out))
    got = out.read_bytes()
    assert n == len(got) == (5 << 20) + 4
    assert got[:4] == b"head" and got[-4:] == b"tail" and got[4:-4].count(0) == len(got) - 8
    shared_sandbox.files.remove("/root/sp")


def test_mode(shared_sandbox: sbx.Sandbox) -> None:
    f = shared_sandbox.files
    f.write("/root/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert f.stat("/root/run.sh").mode & 0o777 == 0o755
    assert shared_sandbox.run("/root/run.sh").stdout == "ran\n"


def test_metadata_operations(shared_sandbox: sbx.Sandbox) -> None:
    f = shared_sandbox.files
    f.mkdir("/root/meta/x/y")
    assert f.stat("/root/meta/x/y").is_dir
    with pytest.raises(sbx.SbxError):
        f.mkdir("/root/meta/p/q", parents=False)
    f.write("/root/meta/x/file.txt", "abc")
    st = f.stat("/root/meta/x/file.txt")
    assert (st.name, st.type, st.size, st.is_file) == ("file.txt", "file", 3, True)
    assert st.path == "/root/meta/x/file.txt"
    assert st.mtime is not None

    names = sorted(e.name for e in f.list("/root/meta/x"))
    assert names == ["file.txt", "y"]
    deep = sorted(e.path for e in f.list("/root/meta", recursive=True))
    assert deep == ["/root/meta/x", "/root/meta/x/file.txt", "/root/meta/x/y"]
    assert sorted(e.path for e in f.list("/root/meta", recursive=True, max_depth=1)) == ["/root/meta/x"]

    f.rename("/root/meta/x/file.txt", "/root/meta/moved.txt")
    assert not f.exists("/root/meta/x/file.txt")
    assert f.read_text("/root/meta/moved.txt") == "abc"

    shared_sandbox.run("ln -s moved.txt /root/meta/link", raise_on_error=True)
    link = f.stat("/root/meta/link")
    assert link.is_symlink and link.symlink_target == "moved.txt"

    with pytest.raises(sbx.SbxError):
        f.remove("/root/meta/x")  # not empty, not recursive
    f.remove("/root/meta", recursive=True)
    assert not f.exists("/root/meta")


def test_file_errors(shared_sandbox: sbx.Sandbox) -> None:
    f = shared_sandbox.files
    with pytest.raises(sbx.NotFoundError):
        f.read("/root/does/not/exist")
    with pytest.raises(sbx.NotFoundError):
        f.stat("/root/does/not/exist")
    with pytest.raises(sbx.NotFoundError):
        f.list("/root/does/not/exist")
    assert not f.exists("/root/does/not/exist")
    with pytest.raises(TypeError):
        f.write("/root/x", 123)  # type: ignore[arg-type]


def _make_tree(root) -> None:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "data.txt").write_text("data\n")
    (root / "run.sh").write_text("#!/bin/sh\necho ok\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "big.bin").write_bytes(os.urandom(300_000))
    (root / "empty_dir").mkdir()
    os.symlink("pkg/sub/data.txt", root / "link.txt")


def test_upload_and_download_dir(shared_sandbox: sbx.Sandbox, tmp_path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _make_tree(src)
    n = shared_sandbox.files.upload_dir(str(src), "/root/proj")
    assert n >= 4
    r = shared_sandbox.run("cd /root/proj && ./run.sh && cat link.txt && ls -d empty_dir && find . | sort")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("ok\ndata\nempty_dir\n")
    assert shared_sandbox.files.read("/root/proj/big.bin") == (src / "big.bin").read_bytes()

    shared_sandbox.run("echo made-inside > /root/proj/pkg/new.txt", raise_on_error=True)
    out = tmp_path / "out"
    shared_sandbox.files.download_dir("/root/proj", str(out))
    assert (out / "pkg" / "new.txt").read_text() == "made-inside\n"
    assert (out / "pkg" / "sub" / "data.txt").read_text() == "data\n"
    assert (out / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert os.access(out / "run.sh", os.X_OK)
    assert (out / "empty_dir").is_dir()
    assert os.readlink(out / "link.txt") == "pkg/sub/data.txt"

    tar_bytes = shared_sandbox.files.download_tar("/root/proj/run.sh")
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tf:
        assert tf.getnames() == ["run.sh"]
    with pytest.raises(sbx.NotFoundError):
        shared_sandbox.files.download_dir("/root/nope", str(tmp_path / "nope"))


def test_download_skips_escaping_links(shared_sandbox: sbx.Sandbox, tmp_path) -> None:
    shared_sandbox.run("mkdir -p /root/evil/d && echo hi > /root/evil/d/f && ln -sf /etc/passwd /root/evil/abs && "
                       "ln -sf ../../../outside /root/evil/rel && ln -sf d/f /root/evil/in", raise_on_error=True)
    with pytest.warns(UserWarning, match=r"skipped 2 symlink\(s\).*abs -> /etc/passwd.*rel -> \.\./\.\./\.\./outside"):
        shared_sandbox.files.download_dir("/root/evil", str(tmp_path / "evil"))
    assert not (tmp_path / "outside").exists()
    assert not os.path.lexists(tmp_path / "evil" / "abs")
    assert not os.path.lexists(tmp_path / "evil" / "rel")
    assert os.readlink(tmp_path / "evil" / "in") == "d/f"
    assert (tmp_path / "evil" / "in").read_text() == "hi\n"


# -- safe extraction, without a daemon ------------------------------------------


def _tar(*members) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for ti, data in members:
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mode = mode
    return ti, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = target
    return ti, None


@pytest.mark.parametrize(
    "members",
    [
        [_file("/abs.txt")],
        [_file("../up.txt")],
        [_file("a/../../up.txt")],
        [_link("h", "../outside", tarfile.LNKTYPE)],
        [_link("l", "."), _file("l/through.txt")],
        [(lambda ti: (setattr(ti, "type", tarfile.CHRTYPE), (ti, None))[1])(tarfile.TarInfo("dev"))],
        [(lambda ti: (setattr(ti, "type", tarfile.FIFOTYPE), (ti, None))[1])(tarfile.TarInfo("fifo"))],
    ],
)
def test_safe_extract_refuses(tmp_path, members) -> None:
    from sbx._tar import safe_extract

    dest = tmp_path / "dest"
    with pytest.raises(sbx.UnsafeArchiveError):
        safe_extract(_tar(*members), str(dest))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]


@pytest.mark.parametrize(
    "members, want_skipped",
    [
        ([_link("l", "/etc/passwd")], ["l -> /etc/passwd"]),
        ([_link("l", "../outside")], ["l -> ../outside"]),
        ([_link("d/l", "../../outside")], ["d/l -> ../../outside"]),
        ([_link("l", "."), _link("l2", "l/..")], ["l2 -> l/.."]),
        ([_link("dir", ".."), _file("dir/escaped.txt")], ["dir -> .."]),
        # "s" when made, but s/x -> .. (made after it) turns it into dest's parent.
        ([_link("l", "s/x/.."), _link("s/x", "..")], ["l -> s/x/.."]),
    ],
)
def test_safe_extract_skips_escaping_links(tmp_path, members, want_skipped) -> None:
    from sbx._tar import safe_extract

    dest = tmp_path / "dest"
    skipped: list = []
    safe_extract(_tar(*members), str(dest), skipped=skipped)
    assert skipped == want_skipped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]
    for root, dirs, files in os.walk(dest):
        for n in dirs + files:
            p = os.path.join(root, n)
            if os.path.islink(p):
                assert os.path.realpath(p).startswith(str(dest.resolve())), p


def test_safe_extract_file_replaces_link(tmp_path) -> None:
    from sbx._tar import safe_extract

    dest = tmp_path / "dest"
    safe_extract(_tar(_file("t", b"target"), _link("l", "t"), _file("l", b"new")), str(dest))
    assert (dest / "t").read_bytes() == b"target"
    assert not os.path.islink(dest / "l") and (dest / "l").read_bytes() == b"new"


def test_safe_extract_accepts_normal_archives(tmp_path) -> None:
    from sbx._tar import safe_extract

    dest = tmp_path / "dest"
    n = safe_extract(
        _tar(_file("a/b.txt", b"hi"), _link("a/l", "b.txt"), _link("a/h", "a/b.txt", tarfile.LNKTYPE),
             _file("setuid", b"#!", 0o4755)),
        str(dest),
    )
    assert n == 4
    assert (dest / "a" / "l").read_text() == "hi"
    assert (dest / "a" / "h").read_text() == "hi"
    assert os.stat(dest / "setuid").st_mode & 0o7777 == 0o755


def test_safe_extract_keeps_holes(tmp_path) -> None:
    """A sandbox's sparse file arrives as zeros; it must not be written out as
    zeros on the client (a 64 MiB box can hold a 2 GiB sparse file)."""
    from sbx._tar import safe_extract

    class Zeros(io.RawIOBase):
        def __init__(self, n: int, tail: bytes) -> None:
            self.left, self.tail = n, tail

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            if self.left > 0:
                n = min(len(b), self.left)
                b[:n] = bytes(n)
                self.left -= n
                return n
            n = min(len(b), len(self.tail))
            b[:n], self.tail = self.tail[:n], self.tail[n:]
            return n

    size = 256 << 20
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo("big")
        ti.size = size + 3
        tf.addfile(ti, io.BufferedReader(Zeros(size, b"end")))
    buf.seek(0)
    safe_extract(buf, str(tmp_path / "out"))
    p = tmp_path / "out" / "big"
    st = os.stat(p)
    assert st.st_size == size + 3
    assert st.st_blocks * 512 < 1 << 20, f"{st.st_blocks * 512} bytes allocated: zeros were written"
    with open(p, "rb") as f:
        f.seek(size)
        assert f.read() == b"end"
