# sbx plotly capture, prepended to the one-shot runner and the python
# kernel. _sbx_plotly() installs an import hook and returns save(fig), which
# writes a figure into $SBX_OUTPUT_DIR as plotly-N.html (self-contained:
# plotly.js inlined from the sandbox's own plotly package, no CDN) and
# plotly-N.plotly.json (mime application/vnd.plotly.v1+json). Nothing is
# imported until the user's code imports plotly: once plotly.io._renderers
# has loaded, a renderer "sbx" calling save is registered and made the
# default (unless $PLOTLY_RENDERER names another), so fig.show() and
# plotly.io.show() produce artifacts. Everything lives in closures: the
# one-shot runner clears __main__'s globals before running user code.
def _sbx_plotly():
    import os, sys

    def save(fig):
        out = os.environ.get("SBX_OUTPUT_DIR", "")
        if not out:
            return
        import plotly.io as pio
        if not isinstance(fig, dict):
            fig = fig.to_dict()
        os.makedirs(out, exist_ok=True)
        n = 1
        while os.path.exists(os.path.join(out, "plotly-%d.html" % n)):
            n += 1
        base = os.path.join(out, "plotly-%d" % n)
        with open(base + ".plotly.json", "w", encoding="utf-8") as f:
            f.write(pio.to_json(fig, validate=False))
        with open(base + ".html", "w", encoding="utf-8") as f:
            f.write(pio.to_html(fig, include_plotlyjs=True, full_html=True, validate=False))

    def install(mod):
        class SbxRenderer(mod.ExternalRenderer):
            def render(self, fig_dict):
                try:
                    save(fig_dict)
                except Exception as e:
                    print("sbx: saving plotly figure: %s" % e, file=sys.stderr)

        mod.renderers["sbx"] = SbxRenderer()
        if not os.environ.get("PLOTLY_RENDERER"):
            mod.renderers.default = "sbx"

    class Finder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "plotly.io._renderers":
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
                    install(module)
                except Exception as e:
                    print("sbx: setting up plotly capture: %s" % e, file=sys.stderr)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder)
    return save


