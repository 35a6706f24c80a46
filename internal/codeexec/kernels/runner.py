# sbx one-shot runner, started by boot.py (plotly.py and notebook.py are
# prepended). _sbx() runs CODE (argv[2]) or else the file at PATH (argv[1])
# as __main__, then saves every open matplotlib figure into $SBX_OUTPUT_DIR
# (before matplotlib's own atexit hook closes them); figures shown
# (plt.show()), plotly figures shown and display()ed objects are saved as
# they are shown. Code that does not compile is retried once with notebook
# lines (!cmd, %pip) rewritten. At the end, if the outputs dir is empty it is removed
# and $SBX_RUN_TOKEN + "empty" is written on stderr, so the daemon need not
# look for artifacts. Kept free of imports beyond os and sys: each costs
# start-up time.
def _sbx():
    import os, sys
    out = os.environ.get("SBX_OUTPUT_DIR", "")
    token = os.environ.pop("SBX_RUN_TOKEN", "")
    if out:
        os.makedirs(out, exist_ok=True)
    rc = "/usr/share/matplotlib/mpl-data/matplotlibrc"
    if "MATPLOTLIBRC" not in os.environ and not os.path.exists("/etc/matplotlibrc") and os.path.exists(rc):
        os.environ["MATPLOTLIBRC"] = rc  # Debian's rc lives in /etc, which images may lack
    path, inline = sys.argv[1], len(sys.argv) > 2
    if inline:
        src = sys.argv[2]
    else:
        with open(path, "rb") as f:
            src = f.read()
    save = _sbx_plotly()
    sys.argv = [path]
    sys.path[0] = os.getcwd() if inline else os.path.dirname(os.path.abspath(path))
    main = sys.modules["__main__"].__dict__
    builtins = main["__builtins__"]
    main.clear()
    main.update(__name__="__main__", __file__=path, __builtins__=builtins)
    _, figures, magics = _sbx_notebook(save, main)

    def finish():
        figures()
        if not out:
            return
        try:
            os.rmdir(out)  # only when empty
        except OSError:
            return
        if token:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
            try:
                os.write(2, (token + "empty\n").encode())
            except OSError:
                pass

    # Inline code runs through exec(str): compile() first builds the ast
    # module's types, ~1.5 ms of a cold start. Its frames are named
    # "<string>"; the traceback printed here names them PATH.
    name = "<string>" if inline else path
    try:
        try:
            exec(src if inline else compile(src, path, "exec"), main)
        except SyntaxError as e:
            # Only a syntax error of the code itself (no frame of it ran).
            if e.filename not in (name, path) or e.__traceback__.tb_next is not None:
                raise
            text = src.decode("utf-8", "replace") if isinstance(src, bytes) else src
            alt = magics(text)
            if alt is None:
                raise
            try:
                code = compile(alt, name, "exec")
            except SyntaxError:
                raise e
            exec(code, main)
    except SystemExit:
        finish()
        raise
    except BaseException as e:
        import linecache, traceback
        if isinstance(src, bytes):
            src = src.decode("utf-8", "replace")
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != name:
            tb = tb.tb_next
        finish()
        te = traceback.TracebackException(type(e), e, tb)
        for f in te.stack:
            if f.filename == name:
                f.filename = path
        if getattr(te, "filename", None) == name:
            te.filename = path  # a SyntaxError's
        sys.stderr.write("".join(te.format()))
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 1)
    finish()


def _sbx_save(lib, src):
    # Saves the runner's source as LIB.py for boot.py to import next time
    # (best effort: a read-only or foreign /tmp only costs speed).
    import os
    if os.path.exists(lib + ".py"):
        return
    try:
        os.makedirs(os.path.dirname(lib), mode=0o755, exist_ok=True)
        # Python would make __pycache__ with the umask's mode: keep it ours alone.
        os.makedirs(os.path.join(os.path.dirname(lib), "__pycache__"), mode=0o755, exist_ok=True)
        tmp = "%s.%d.tmp" % (lib, os.getpid())
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w", encoding="utf-8") as f:
            f.write(src)
        os.replace(tmp, lib + ".py")
    except OSError:
        pass
