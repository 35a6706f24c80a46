# sbx one-shot runner: python3 -c RUNNER PATH [CODE]. Runs CODE (or the file
# at PATH) as __main__, then saves every open matplotlib figure into
# $SBX_OUTPUT_DIR (before matplotlib's own atexit hook closes them). Kept
# free of imports beyond os and sys: each costs start-up time.
def _sbx():
    import os, sys
    out = os.environ.get("SBX_OUTPUT_DIR", "")
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
    sys.argv = [path]
    sys.path[0] = os.getcwd() if inline else os.path.dirname(os.path.abspath(path))
    main = sys.modules["__main__"].__dict__
    builtins = main["__builtins__"]
    main.clear()
    main.update(__name__="__main__", __file__=path, __builtins__=builtins)

    def save_figures():
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None or not out:
            if out:
                try:
                    os.rmdir(out)  # only when empty: then the daemon need not look
                except OSError:
                    pass
            return
        for i, num in enumerate(plt.get_fignums(), 1):
            try:
                plt.figure(num).savefig(os.path.join(out, "figure-%d.png" % i), format="png")
            except Exception as e:
                print("sbx: saving figure %d: %s" % (i, e), file=sys.stderr)

    try:
        code = compile(src, path, "exec")
        exec(code, main)
    except SystemExit:
        save_figures()
        raise
    except BaseException as e:
        import linecache, traceback
        if isinstance(src, bytes):
            src = src.decode("utf-8", "replace")
        linecache.cache[path] = (len(src), None, src.splitlines(True), path)
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        save_figures()
        traceback.print_exception(type(e), e, tb)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 1)
    save_figures()


_sbx()
