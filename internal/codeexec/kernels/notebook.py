# sbx notebook habits, prepended (after plotly.py) to the one-shot runner
# and the python kernel. _sbx_notebook(plotly_save, ns) returns helpers:
#   figure(fig)    saves a matplotlib figure as the next free figure-N.png
#                  in $SBX_OUTPUT_DIR;
#   finish()       saves every figure still open and closes them;
#   magics(src)    rewrites notebook lines (!cmd, x = !cmd, %pip, %cd, %env,
#                  %matplotlib, %%bash) into Python calls, or returns None.
# It also installs, without importing anything: a hook making
# matplotlib.pyplot.show() and Figure.show() save the figures shown (each
# show ends them, as in Jupyter, so the next plot starts on a fresh
# figure); builtins.display() (images, HTML, markdown, plotly and
# matplotlib figures become display-N.EXT / figure-N.png artifacts, the
# text repr goes to stdout); and a fallback IPython.display module with
# display, HTML, Markdown, Image, SVG and JSON for images without IPython.
def _sbx_notebook(plotly_save, ns):
    import os, sys, builtins

    def target(prefix, ext):
        out = os.environ.get("SBX_OUTPUT_DIR", "")
        if not out:
            return None
        os.makedirs(out, exist_ok=True)
        n = 1
        while os.path.exists(os.path.join(out, "%s-%d.%s" % (prefix, n, ext))):
            n += 1
        return os.path.join(out, "%s-%d.%s" % (prefix, n, ext))

    def figure(fig):
        p = target("figure", "png")
        if p is not None:
            try:
                fig.savefig(p, format="png")
            except Exception as e:
                sys.stderr.write("sbx: saving figure: %s\n" % e)

    def finish(skip=None):
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None or not os.environ.get("SBX_OUTPUT_DIR"):
            return
        for num in plt.get_fignums():
            fig = plt.figure(num)
            if fig is not skip:
                figure(fig)
        plt.close("all")

    def patch_pyplot(plt):
        orig = plt.show

        def show(*args, **kwargs):
            if not os.environ.get("SBX_OUTPUT_DIR"):
                return orig(*args, **kwargs)
            finish()

        show.__doc__ = orig.__doc__
        plt.show = show
        Figure = sys.modules["matplotlib.figure"].Figure

        def fig_show(self, warn=True):
            if not os.environ.get("SBX_OUTPUT_DIR"):
                return
            figure(self)
            plt.close(self)

        Figure.show = fig_show

    class Finder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "matplotlib.pyplot":
                return None
            sys.meta_path[:] = [f for f in sys.meta_path if f is not Finder]
            from importlib.util import find_spec
            spec = find_spec(name)
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            run = loader.exec_module

            def exec_module(module):
                run(module)
                try:
                    patch_pyplot(module)
                except Exception as e:
                    sys.stderr.write("sbx: setting up matplotlib capture: %s\n" % e)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder)

    def write(prefix, ext, data):
        p = target(prefix, ext)
        if p is None:
            return
        with open(p, "wb" if isinstance(data, bytes) else "w", **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as f:
            f.write(data)

    rich = (("image/png", "png"), ("image/jpeg", "jpeg"), ("image/svg+xml", "svg"), ("text/html", "html"),
            ("text/markdown", "md"), ("text/latex", "tex"), ("application/json", "json"))

    def bundle(obj):
        data = {}
        m = getattr(obj, "_repr_mimebundle_", None)
        if callable(m):
            try:
                b = m()
                if isinstance(b, tuple):
                    b = b[0]
                data.update(b or {})
            except Exception:
                pass
        for mime, ext in rich:
            if mime in data:
                continue
            m = getattr(obj, "_repr_%s_" % ext.replace("md", "markdown").replace("tex", "latex"), None)
            if not callable(m):
                continue
            try:
                v = m()
            except Exception:
                continue
            if isinstance(v, tuple):
                v = v[0]
            if v:
                data[mime] = v
        return data

    def display(*objs, **kwargs):
        for obj in objs:
            try:
                pbase = sys.modules.get("plotly.basedatatypes")
                if pbase is not None and isinstance(obj, pbase.BaseFigure):
                    plotly_save(obj)
                    continue
                mfig = sys.modules.get("matplotlib.figure")
                if mfig is not None and isinstance(obj, mfig.Figure):
                    figure(obj)
                    plt = sys.modules.get("matplotlib.pyplot")
                    if plt is not None:
                        plt.close(obj)
                    continue
                data = bundle(obj)
                image = False
                for mime, ext in rich:
                    v = data.get(mime)
                    if v is None:
                        continue
                    if mime in ("image/png", "image/jpeg") and isinstance(v, str):
                        import base64
                        v = base64.b64decode(v)
                    if mime == "application/json" and not isinstance(v, (str, bytes)):
                        import json
                        v = json.dumps(v)
                    write("display", ext, v)
                    image = mime.startswith("image/")
                    break
                if not image:
                    text = data.get("text/plain")
                    print(text if isinstance(text, str) else repr(obj))
            except Exception as e:
                sys.stderr.write("sbx: display: %s\n" % e)

    builtins.display = display

    def ipython_display():
        import types
        m = types.ModuleType("IPython.display")
        m.__doc__ = "sbx's stand-in for IPython.display (IPython is not installed)."

        class _Data:
            mime = "text/plain"

            def __init__(self, data=None, url=None, filename=None, **kwargs):
                if filename is not None:
                    with open(filename, "rb" if self.binary(filename, kwargs) else "r") as f:
                        data = f.read()
                self.data, self.url, self.kwargs = data, url, kwargs

            def binary(self, filename, kwargs):
                return False

            def __repr__(self):
                return self.data if isinstance(self.data, str) else "<%s object>" % type(self).__name__

        def kind(name, mime, attr):
            return type(name, (_Data,), {"mime": mime, attr: lambda self: self.data})

        m.HTML = kind("HTML", "text/html", "_repr_html_")
        m.Markdown = kind("Markdown", "text/markdown", "_repr_markdown_")
        m.SVG = kind("SVG", "image/svg+xml", "_repr_svg_")
        m.Latex = kind("Latex", "text/latex", "_repr_latex_")
        m.JSON = kind("JSON", "application/json", "_repr_json_")

        class Image(_Data):
            def binary(self, filename, kwargs):
                return True

            def _fmt(self):
                f = (self.kwargs.get("format") or "").lower()
                if not f and isinstance(self.data, bytes) and self.data[:3] == b"\xff\xd8\xff":
                    f = "jpeg"
                return "jpeg" if f in ("jpg", "jpeg") else "png"

            def _repr_png_(self):
                return self.data if self._fmt() == "png" else None

            def _repr_jpeg_(self):
                return self.data if self._fmt() == "jpeg" else None

        m.Image = Image
        m.display = display
        m.clear_output = lambda wait=False: None
        return m

    def from_user():
        # Whether the import comes from the user's code (__main__), not from
        # a library probing for IPython (plotly, pandas, tqdm): those must
        # keep seeing no IPython.
        f = sys._getframe(2)
        while f is not None and f.f_code.co_filename.startswith("<frozen importlib"):
            f = f.f_back
        return f is not None and f.f_globals.get("__name__") == "__main__"

    class Fallback:
        # Last on sys.meta_path: a real IPython, when installed, wins.
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name not in ("IPython", "IPython.display", "IPython.core", "IPython.core.display"):
                return None
            if name == "IPython" and not from_user():
                return None
            import importlib.machinery as mach

            class Loader:
                @staticmethod
                def create_module(spec):
                    if spec.name.endswith("display"):
                        mod = ipython_display()
                        mod.__name__ = spec.name
                        return mod
                    import types
                    mod = types.ModuleType(spec.name)
                    mod.__path__ = []
                    mod.get_ipython = lambda: None  # not running in IPython
                    return mod

                @staticmethod
                def exec_module(module):
                    pass

            return mach.ModuleSpec(name, Loader, is_package=not name.endswith("display"))

    sys.meta_path.append(Fallback)

    def expand(s):
        # IPython's {expr} and $name in shell lines, from the user's namespace.
        import re

        def brace(m):
            try:
                return str(eval(m.group(1), ns))
            except Exception:
                return m.group(0)

        s = re.sub(r"(?<!\{)\{([^{}]+)\}(?!\})", brace, s)
        return re.sub(r"(?<!\$)\$([A-Za-z_]\w*)", lambda m: str(ns[m.group(1)]) if m.group(1) in ns else m.group(0), s)

    def flush():
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass

    def shell(cmd, capture=False):
        import subprocess
        flush()
        sh = "/bin/bash" if os.path.exists("/bin/bash") else None
        r = subprocess.run(expand(cmd), shell=True, executable=sh, stdout=subprocess.PIPE if capture else None)
        ns["_exit_code"] = r.returncode
        if capture:
            return r.stdout.decode("utf-8", "replace").splitlines()
        return None

    def pip(args):
        import shlex, subprocess, site, importlib
        argv = shlex.split(expand(args))
        if argv[:1] == ["install"] and sys.prefix == sys.base_prefix and not {"--user", "--target", "-t", "--prefix", "--root"} & set(argv):
            argv.insert(1, "--user")  # the image's site-packages may be read-only
        env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        flush()
        r = subprocess.run([sys.executable, "-m", "pip"] + argv, env=env)
        ns["_exit_code"] = r.returncode
        usp = site.getusersitepackages()
        if usp not in sys.path and os.path.isdir(usp):
            site.addsitedir(usp)
        importlib.invalidate_caches()
        if r.returncode:
            sys.stderr.write("sbx: pip exited with code %d\n" % r.returncode)

    def env_magic(args):
        args = args.strip()
        if not args:
            return dict(os.environ)
        if "=" in args or " " in args:
            k, _, v = args.partition("=" if "=" in args else " ")
            os.environ[k.strip()] = expand(v.strip())
            return None
        return os.environ.get(args)

    def magic(name, args=""):
        if name == "sh":
            return shell(args)
        if name == "sx":
            return shell(args, capture=True)
        if name == "pip":
            return pip(args)
        if name == "cd":
            os.chdir(os.path.expanduser(expand(args.strip()) or "~"))
            print(os.getcwd())
            return None
        if name == "pwd":
            return os.getcwd()
        if name == "env":
            return env_magic(args)
        if name in ("matplotlib", "config", "load_ext", "reload_ext", "autoreload"):
            return None  # figures are captured anyway; nothing to configure
        if name in ("bash", "sh-cell"):
            import subprocess
            flush()
            ns["_exit_code"] = subprocess.run(["bash" if os.path.exists("/bin/bash") else "sh", "-c", args]).returncode
            return None
        raise NotImplementedError("unsupported magic %%%s (sbx supports !cmd, x = !cmd, %%pip, %%cd, %%pwd, %%env, "
                                  "%%matplotlib and %%%%bash)" % name)

    builtins.__sbx_magic__ = magic

    def magics(src):
        import re
        lines = src.split("\n")
        first = lines[0].strip()
        if first.startswith("%%"):
            name = first[2:].split()[0] if first[2:].split() else ""
            if name in ("bash", "sh"):
                return "__sbx_magic__('bash', %r)" % "\n".join(lines[1:])
            return "__sbx_magic__(%r)" % ("%" + name)
        changed = False
        pat = re.compile(r"^(\s*)(?:([A-Za-z_][\w.]*)\s*=\s*)?([!%])(.*)$")
        for i, line in enumerate(lines):
            m = pat.match(line)
            if m is None or line.lstrip().startswith("%%"):
                continue
            ind, var, kind, rest = m.groups()
            if kind == "!":
                call = "__sbx_magic__(%r, %r)" % ("sx" if var else "sh", rest)
            else:
                name, _, args = rest.strip().partition(" ")
                if not re.match(r"^\w+$", name):
                    continue
                call = "__sbx_magic__(%r, %r)" % (name, args)
            lines[i] = ind + (var + " = " if var else "") + call
            changed = True
        return "\n".join(lines) if changed else None

    return figure, finish, magics
