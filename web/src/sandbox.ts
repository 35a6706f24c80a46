// The sandbox page: its state, live graphs from the Stats history, its
// logs (followed), a file browser and a terminal.
import { h, clear, svg, bytes, labelsText } from "./dom";
import { sandboxes, observe, errText, readFile, writeFile } from "./api";
import { FileType } from "@gen/files_pb.js";
import type { StatsSample } from "@gen/observe_pb.js";
import { stateName } from "./sandboxes";

type Series = { title: string; id: string; value: (s: StatsSample, prev?: StatsSample) => number; fmt: (n: number) => string };

const series: Series[] = [
  { title: "CPU", id: "cpu", value: (s) => Number(s.cpuMillis), fmt: (n) => `${n.toFixed(0)} m` },
  { title: "Memory", id: "memory", value: (s) => Number(s.memoryBytes), fmt: bytes },
  { title: "Disk", id: "disk", value: (s) => Number(s.diskUsedBytes), fmt: bytes },
  {
    title: "Network (rx+tx /s)", id: "net",
    value: (s, p) => (p ? Math.max(0, Number(s.netRxBytes + s.netTxBytes - p.netRxBytes - p.netTxBytes)) / Math.max(1, Number(s.timeMs - p.timeMs) / 1000) : 0),
    fmt: (n) => bytes(n) + "/s",
  },
];

const W = 320, H = 90;

function graph(s: Series, samples: StatsSample[]): HTMLElement {
  const pts = samples.map((x, i) => [Number(x.timeMs), s.value(x, samples[i - 1])] as const);
  const maxY = Math.max(1, ...pts.map((p) => p[1]));
  const el = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "graph", "data-points": pts.length, "data-max": maxY });
  el.appendChild(svg("rect", { x: 0, y: 0, width: W, height: H, class: "bg" }));
  if (pts.length) {
    const t0 = pts[0][0], t1 = Math.max(t0 + 1, pts[pts.length - 1][0]);
    const coords = pts.map(([t, v]) => `${(((t - t0) / (t1 - t0)) * (W - 4) + 2).toFixed(1)},${(H - 2 - (v / maxY) * (H - 14)).toFixed(1)}`);
    el.appendChild(svg("polyline", { points: coords.join(" "), class: "line" }));
  }
  const last = pts.length ? pts[pts.length - 1][1] : 0;
  return h("figure", { class: "chart", id: "graph-" + s.id }, h("figcaption", {}, `${s.title}: ${s.fmt(last)} (max ${s.fmt(maxY)})`), el as unknown as HTMLElement);
}

export function sandboxPage(main: HTMLElement, id: string): () => void {
  const ac = new AbortController();
  const stops: (() => void)[] = [() => ac.abort()];
  const info = h("dl", { class: "info" });
  const graphs = h("div", { class: "graphs", id: "graphs" });
  const logs = h("pre", { class: "logs", id: "logs" });
  const files = h("div", { id: "files" });
  const term = h("div", { class: "terminal", id: "terminal" });
  const status = h("p", { class: "status" });
  main.append(
    h("p", {}, h("a", { href: "#/sandboxes" }, "← Sandboxes")),
    h("h2", { id: "sandbox-title" }, id),
    status, info,
    h("h3", {}, "Resources"), graphs,
    h("h3", {}, "Terminal"), term,
    h("h3", {}, "Files"), files,
    h("h3", {}, "Logs"), logs);

  (async () => {
    try {
      const r = await sandboxes.getSandbox({ sandbox: id }, { signal: ac.signal });
      const sb = r.sandbox!;
      main.querySelector("#sandbox-title")!.textContent = sb.name || sb.id;
      clear(info);
      const rows: [string, string][] = [["ID", sb.id], ["State", stateName(sb.state)], ["Runtime", sb.runtime], ["Image", sb.image], ["Labels", labelsText(sb.labels)]];
      for (const [k, v] of rows) info.append(h("dt", {}, k), h("dd", {}, v));
    } catch (e) {
      status.textContent = "Failed: " + errText(e);
    }
  })();

  async function stats(): Promise<void> {
    try {
      const r = await observe.stats({ sandboxes: [id], history: true }, { signal: ac.signal });
      const e = r.sandboxes[0];
      if (!e) return;
      const samples = e.history.length ? e.history : e.current ? [e.current] : [];
      clear(graphs);
      for (const s of series) graphs.appendChild(graph(s, samples));
    } catch (e) {
      if (!ac.signal.aborted) status.textContent = "Stats failed: " + errText(e);
    }
  }
  void stats();
  const timer = setInterval(() => void stats(), 2000);
  stops.push(() => clearInterval(timer));

  (async () => {
    const dec = new TextDecoder();
    try {
      for await (const ev of sandboxes.logs({ sandbox: id, follow: true, tail: 500 }, { signal: ac.signal })) {
        if (ev.event.case === "data") {
          logs.append(dec.decode(ev.event.value.data, { stream: true }));
          if (logs.textContent!.length > 200_000) logs.textContent = logs.textContent!.slice(-100_000);
          logs.scrollTop = logs.scrollHeight;
        } else if (ev.event.case === "exited") {
          logs.append(`\n[main command exited: ${ev.event.value.exitCode}]\n`);
        }
      }
    } catch (e) {
      if (!ac.signal.aborted) logs.append(`\n[logs: ${errText(e)}]\n`);
    }
  })();

  stops.push(fileBrowser(files, id, ac.signal));
  // xterm.js is half the bundle: loaded when a sandbox page first opens.
  let closeTerm: (() => void) | undefined;
  let gone = false;
  import("./terminal").then(({ openTerminal }) => {
    if (!gone) closeTerm = openTerminal(term, id);
  }, (e) => term.append("terminal failed to load: " + errText(e)));
  stops.push(() => {
    gone = true;
    closeTerm?.();
  });
  return () => stops.forEach((f) => f());
}

const maxEdit = 1 << 20;

function fileBrowser(el: HTMLElement, id: string, signal: AbortSignal): () => void {
  const path = h("input", { id: "files-path", value: "/tmp" });
  const status = h("p", { class: "status", id: "files-status" });
  const tbody = h("tbody", {});
  const upload = h("input", { type: "file", id: "files-upload" });
  const editor = h("div", { id: "editor" });
  const go = h("button", { type: "submit" }, "List");
  const form = h("form", { class: "row" }, path, go, h("label", {}, "Upload: ", upload));

  function join(dir: string, name: string): string {
    return dir.replace(/\/+$/, "") + "/" + name;
  }

  async function list(): Promise<void> {
    try {
      const r = await sandboxes.listDir({ sandbox: id, path: path.value }, { signal });
      clear(tbody);
      const dir = path.value;
      if (dir !== "/") {
        const up = h("a", { href: "#" + location.hash.slice(1) }, "..");
        up.addEventListener("click", (ev) => {
          ev.preventDefault();
          path.value = dir.replace(/\/+$/, "").replace(/\/[^/]*$/, "") || "/";
          void list();
        });
        tbody.appendChild(h("tr", {}, h("td", {}, up), h("td", {}), h("td", {}), h("td", {})));
      }
      for (const f of r.entries) {
        const full = join(dir, f.name);
        const isDir = f.type === FileType.DIR;
        const name = isDir ? h("a", { href: "#" + location.hash.slice(1), class: "dir" }, f.name + "/") : h("span", {}, f.name);
        if (isDir) {
          name.addEventListener("click", (ev) => {
            ev.preventDefault();
            path.value = full;
            void list();
          });
        }
        const actions = h("td", {});
        if (!isDir) {
          const dl = h("button", { class: "download", "data-name": f.name }, "Download");
          dl.addEventListener("click", () => void download(full, f.name));
          actions.append(dl);
          if (f.size <= maxEdit) {
            const ed = h("button", { class: "edit", "data-name": f.name }, "Edit");
            ed.addEventListener("click", () => void edit(full));
            actions.append(" ", ed);
          }
        }
        tbody.appendChild(h("tr", { "data-name": f.name }, h("td", {}, name), h("td", {}, isDir ? "" : bytes(f.size)),
          h("td", { class: "mono" }, (f.mode & 0o7777).toString(8)), actions));
      }
    } catch (e) {
      if (!signal.aborted) status.textContent = "List failed: " + errText(e);
    }
  }

  async function download(full: string, name: string): Promise<void> {
    try {
      const data = await readFile(id, full, signal);
      const url = URL.createObjectURL(new Blob([data as BlobPart], { type: "application/octet-stream" }));
      const a = h("a", { href: "#", download: name });
      a.setAttribute("href", url);
      a.click();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (e) {
      status.textContent = "Download failed: " + errText(e);
    }
  }

  async function edit(full: string): Promise<void> {
    clear(editor);
    try {
      const data = await readFile(id, full, signal);
      let text: string;
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(data);
      } catch {
        status.textContent = `${full} is not UTF-8 text: download it instead.`;
        return;
      }
      const area = h("textarea", { id: "editor-text", rows: 16, spellcheck: "false" });
      area.value = text;
      const save = h("button", { id: "editor-save" }, "Save");
      const close = h("button", {}, "Close");
      save.addEventListener("click", async () => {
        try {
          await writeFile(id, full, new TextEncoder().encode(area.value));
          status.textContent = `Saved ${full}.`;
          void list();
        } catch (e) {
          status.textContent = "Save failed: " + errText(e);
        }
      });
      close.addEventListener("click", () => clear(editor));
      editor.append(h("h4", {}, full), area, h("div", { class: "row" }, save, close));
    } catch (e) {
      status.textContent = "Read failed: " + errText(e);
    }
  }

  upload.addEventListener("change", async () => {
    const f = upload.files?.[0];
    if (!f) return;
    try {
      const n = await writeFile(id, join(path.value, f.name), new Uint8Array(await f.arrayBuffer()));
      status.textContent = `Uploaded ${f.name} (${n} bytes).`;
      upload.value = "";
      void list();
    } catch (e) {
      status.textContent = "Upload failed: " + errText(e);
    }
  });
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    void list();
  });
  el.append(form, status, h("table", { id: "file-list" }, h("thead", {}, h("tr", {}, ...["Name", "Size", "Mode", ""].map((c) => h("th", {}, c)))), tbody), editor);
  void list();
  return () => {};
}
