# sbx Python kernel: one JSON request per stdin line ({"code", "out"}),
# executes it in a persistent namespace, then writes TOKEN + JSON reply on
# stdout and TOKEN on stderr. User output goes straight to fds 1 and 2.
# Matplotlib figures shown (plt.show() ends a figure) or left open, plotly
# figures shown and display()ed objects (or the value of a cell's last
# expression) become artifacts in the run's outputs dir. Notebook lines
# (!cmd, %pip ...) are rewritten by notebook.py when a cell does not parse.
import ast, base64, io, json, os, site, sys, traceback, importlib

TOKEN = os.environ.pop("SBX_KERNEL_TOKEN", "")
_requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
sys.stdin = io.StringIO("")
os.environ.setdefault("MPLBACKEND", "Agg")
_rc = "/usr/share/matplotlib/mpl-data/matplotlibrc"
if "MATPLOTLIBRC" not in os.environ and not os.path.exists("/etc/matplotlibrc") and os.path.exists(_rc):
    os.environ["MATPLOTLIBRC"] = _rc  # Debian's rc lives in /etc, which images may lack
ns = {"__name__": "__main__", "__builtins__": __builtins__}
_plotly_save = _sbx_plotly()  # prepended from plotly.py
_figure, _finish, _magics = _sbx_notebook(_plotly_save, ns)  # prepended from notebook.py


def _png(fig):
    b = io.BytesIO()
    fig.savefig(b, format="png")
    return base64.b64encode(b.getvalue()).decode()


def _bundle(v):
    try:
        pbase = sys.modules.get("plotly.basedatatypes")
        if pbase is not None and isinstance(v, pbase.BaseFigure):
            _plotly_save(v)  # shown as artifacts, like Jupyter's display of the last value
            return {"text": "<%s>" % type(v).__name__}
    except Exception as e:
        sys.stderr.write("sbx: saving plotly figure: %s\n" % e)
    out = {"text": repr(v)}
    try:
        mpl = sys.modules.get("matplotlib.figure")
        if mpl is not None and isinstance(v, mpl.Figure):
            out["png"] = _png(v)
            out["text"] = "<Figure>"
            return out
        if hasattr(v, "_repr_png_"):
            p = v._repr_png_()
            if p:
                out["png"] = base64.b64encode(p).decode()
        if hasattr(v, "_repr_html_"):
            h = v._repr_html_()
            if h:
                out["html"] = h
    except Exception:
        pass
    return out


def run(code, out):
    if out:
        os.makedirs(out, exist_ok=True)
        os.environ["SBX_OUTPUT_DIR"] = out
    usp = site.getusersitepackages()
    if usp not in sys.path and os.path.isdir(usp):
        site.addsitedir(usp)
    importlib.invalidate_caches()
    reply = {"ok": True}
    try:
        try:
            tree = ast.parse(code, "<cell>", "exec")
        except SyntaxError as e:
            alt = _magics(code)
            if alt is None:
                raise
            try:
                tree = ast.parse(alt, "<cell>", "exec")
            except SyntaxError:
                raise e
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), ns)
        if last is not None:
            v = eval(compile(last, "<cell>", "eval"), ns)
            if v is not None:
                ns["_"] = v
                reply["value"] = _bundle(v)
    except BaseException as e:  # KeyboardInterrupt from a timeout too
        if isinstance(e, SystemExit):
            raise
        reply = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        sys.stderr.write("".join(tb[1:] if len(tb) > 1 else tb))
    if out:
        _finish(ns.get("_") if reply.get("value") else None)
    if out:
        try:
            os.rmdir(out)  # only when empty: then the daemon need not look
        except OSError:
            reply["artifacts"] = True
    return reply


def main():
    for line in _requests:
        if not line.strip():
            continue
        req = json.loads(line)
        reply = run(req.get("code", ""), req.get("out", ""))
        reply["id"] = req.get("id", 0)
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(1, (TOKEN + json.dumps(reply) + "\n").encode())
        os.write(2, (TOKEN + str(reply["id"]) + "\n").encode())


main()
