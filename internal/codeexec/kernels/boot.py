# sbx one-shot boot: python3 -c BOOT LIB SRC PATH [CODE]. Imports the runner
# (SRC: plotly.py + runner.py) as module LIB (DIR/NAME, NAME carrying SRC's
# hash) so that Python loads it from DIR/__pycache__: a process's first
# compile() is slow (~2 ms for SRC). LIB.py or DIR owned by another uid or
# writable by others is not used (DIR/__pycache__ is made 0755 with DIR).
# Otherwise (first run, read-only /tmp) SRC is compiled and saved as LIB.py
# for the next run. Then _sbx() runs PATH [CODE]. Kept tiny: this stub
# itself is compiled on every run.
def _b():
    import os, sys
    lib, src = sys.argv[1], sys.argv[2]
    del sys.argv[1:3]
    d, _, name = lib.rpartition("/")
    m = None
    try:
        u, a, b = os.getuid(), os.stat(d), os.stat(lib + ".py")
        if a.st_uid == u == b.st_uid and not (a.st_mode | b.st_mode) & 0o22:
            sys.path.insert(0, d)
            try:
                m = __import__(name)
            finally:
                del sys.path[0]
    except Exception:
        m = None
    if m is not None:
        return m._sbx()
    g = {"__builtins__": __builtins__}
    exec(compile(src, "<sbx-runner>", "exec"), g)
    g["_sbx_save"](lib, src)
    return g["_sbx"]()


_b()
