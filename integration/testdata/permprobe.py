# Runs inside a sandbox whose /workspace is guarded with agent-safe (plus
# README: view). Tries each operation and prints "name result" per line,
# result being "ok" or the errno name.
import ctypes, errno, mmap, os, sys

W = "/workspace"
libc = ctypes.CDLL(None, use_errno=True)


def res(name, fn):
    try:
        fn()
        r = "ok"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e.errno))
    print(name, r)


def read(p):
    with open(p, "rb") as f:
        f.read()


def write(p):
    with open(p, "wb") as f:
        f.write(b"x")


def cfn(call):
    def fn():
        if call() != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    return fn


def mmap_write(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def listed(name):
    return lambda: None if name in os.listdir(W) else (_ for _ in ()).throw(OSError(errno.ENOENT, "not listed"))


# Per permission.
res("list_env", listed(".env"))
res("list_secrets", listed("secrets"))
res("list_key", listed("a.key"))
res("list_src", listed("src"))
res("stat_env", lambda: os.stat(W + "/.env"))
res("read_env", lambda: read(W + "/.env"))
res("read_secret", lambda: read(W + "/secrets/x"))
res("read_key", lambda: read(W + "/a.key"))
res("stat_readme_view", lambda: os.stat(W + "/README"))
res("read_readme_view", lambda: read(W + "/README"))
res("read_src", lambda: read(W + "/src/main.go"))
res("write_src", lambda: write(W + "/src/main.go"))
res("create_src", lambda: write(W + "/src/new.go"))
res("truncate_src", lambda: os.truncate(W + "/src/main.go", 0))
res("chmod_src", lambda: os.chmod(W + "/src/main.go", 0o600))
res("unlink_src", lambda: os.unlink(W + "/src/main.go"))
res("mkdir_src", lambda: os.mkdir(W + "/src/d"))
res("write_output", lambda: write(W + "/output/new"))
res("mkdir_output", lambda: os.mkdir(W + "/output/d"))
res("create_output_key", lambda: write(W + "/output/x.key"))
res("setxattr_output", lambda: os.setxattr(W + "/output/new", "user.a", b"1"))
# Symlinks: relative, absolute, via "..".
res("symlink_make", lambda: os.symlink("../.env", W + "/output/s1"))
res("symlink_rel_hidden", lambda: read(W + "/output/s1"))
os.symlink(W + "/secrets/x", W + "/output/s2")
res("symlink_abs_hidden", lambda: read(W + "/output/s2"))
os.symlink("../src/../secrets/x", W + "/output/s3")
res("symlink_dotdot_hidden", lambda: read(W + "/output/s3"))
os.symlink("../src/main.go", W + "/output/s4")
res("symlink_write_readonly", lambda: write(W + "/output/s4"))
res("symlink_read_readonly", lambda: read(W + "/output/s4"))
# Hardlinks.
res("link_readonly", lambda: os.link(W + "/src/main.go", W + "/output/h1"))
res("link_view", lambda: os.link(W + "/README", W + "/output/h2"))
res("link_hidden", lambda: os.link(W + "/.env", W + "/output/h3"))
res("link_writable", lambda: os.link(W + "/output/new", W + "/output/h4"))
# Renames.
res("rename_readonly_in", lambda: os.rename(W + "/src/main.go", W + "/output/m"))
res("rename_over_hidden", lambda: os.rename(W + "/output/new", W + "/output/.env"))
res("rename_into_hidden_dir", lambda: os.rename(W + "/output/new", W + "/secrets/y"))
res("rename_dir_to_readonly", lambda: os.rename(W + "/output/d", W + "/src/d"))
res("rename_writable", lambda: os.rename(W + "/output/h4", W + "/output/h5"))
# "..", /proc/self/root, mmap.
res("dotdot_hidden", lambda: read(W + "/output/../secrets/x"))
res("dotdot_env", lambda: read(W + "/src/../.env"))
res("procroot_hidden", lambda: read("/proc/self/root" + W + "/.env"))
res("procroot_write", lambda: write("/proc/self/root" + W + "/src/main.go"))
res("mmap_write_readonly", lambda: mmap_write(W + "/src/main.go"))
# Privileges.
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
for k in ("CapEff", "CapBnd", "CapPrm"):
    print("sysadmin_" + k, "set" if int(status[k], 16) & (1 << 21) else "clear")
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
res("umount_guard", cfn(lambda: libc.umount2(W.encode(), 2)))
os.makedirs("/tmp/mnt", exist_ok=True)
res("mount_tmpfs", cfn(lambda: libc.mount(b"x", b"/tmp/mnt", b"tmpfs", 0, None)))
res("proc1_root", lambda: os.listdir("/proc/1/root/"))


def proc1_fds(op):
    # Listing the numbers is allowed (the agent is root's); following any
    # of them must not be.
    def fn():
        fds = os.listdir("/proc/1/fd")
        if not fds:
            raise OSError(errno.ENODATA, "no fds")
        errs = set()
        for n in fds:
            try:
                op("/proc/1/fd/" + n)
            except OSError as e:
                errs.add(e.errno)
                continue
            return  # reached: reported as "ok"
        if errs != {errno.EACCES}:
            raise OSError(min(errs), "mixed")
        raise OSError(errno.EACCES, "all denied")
    return fn


res("proc1_fd_open", proc1_fds(lambda p: os.close(os.open(p, os.O_RDONLY))))
res("proc1_fd_readlink", proc1_fds(os.readlink))
res("proc1_fd_stat", proc1_fds(os.stat))
res("proc1_cwd", lambda: os.readlink("/proc/1/cwd"))
res("unchanged", lambda: None if open(W + "/src/main.go").read() == "package main\n" else (_ for _ in ()).throw(OSError(errno.EIO, "changed")))
