import { h, clear, bytes, time, labelsText } from "./dom";
import { images, volumes, codebases, observe, errText } from "./api";
import { EventType } from "@gen/observe_pb.js";

// table fills a page with one table from a loader.
function tablePage(main: HTMLElement, title: string, id: string, cols: string[], load: (signal: AbortSignal) => Promise<(string | number)[][]>): () => void {
  const tbody = h("tbody", {});
  const status = h("p", { class: "status" });
  const ac = new AbortController();
  main.append(h("h2", {}, title), status,
    h("table", { id }, h("thead", {}, h("tr", {}, ...cols.map((c) => h("th", {}, c)))), tbody));
  async function refresh(): Promise<void> {
    try {
      const rows = await load(ac.signal);
      clear(tbody);
      for (const r of rows) tbody.appendChild(h("tr", {}, ...r.map((c) => h("td", {}, c))));
      if (!rows.length) tbody.appendChild(h("tr", {}, h("td", { colspan: cols.length, class: "empty" }, "None.")));
    } catch (e) {
      if (!ac.signal.aborted) status.textContent = "Failed: " + errText(e);
    }
  }
  void refresh();
  const timer = setInterval(() => void refresh(), 5000);
  return () => {
    clearInterval(timer);
    ac.abort();
  };
}

export function imagesPage(main: HTMLElement): () => void {
  return tablePage(main, "Images", "images", ["Ref", "Digest", "Size", "Layers", "Created"], async (signal) => {
    const r = await images.listImages({}, { signal });
    return r.images.map((i) => [i.ref, i.digest.slice(0, 19), bytes(i.sizeBytes), i.layers, time(i.createdAtMs)]);
  });
}

export function volumesPage(main: HTMLElement): () => void {
  return tablePage(main, "Volumes", "volumes", ["Name", "Used", "Size", "Created", "Sandboxes"], async (signal) => {
    const r = await volumes.listVolumes({}, { signal });
    return r.volumes.map((v) => [v.name, bytes(v.usedBytes), v.sizeBytes ? bytes(v.sizeBytes) : "unlimited", time(v.createdAtMs), v.sandboxes.join(", ")]);
  });
}

export function codebasesPage(main: HTMLElement): () => void {
  return tablePage(main, "Codebases", "codebases", ["Name", "ID", "Revision", "Files", "Size", "Updated"], async (signal) => {
    const r = await codebases.listCodebases({}, { signal });
    return r.codebases.map((c) => [c.name, c.id, String(c.revision), String(c.fileCount), bytes(c.sizeBytes), time(c.updatedAtMs)]);
  });
}

// eventsPage follows the daemon's event stream (the last hour first).
export function eventsPage(main: HTMLElement): () => void {
  const tbody = h("tbody", {});
  const status = h("p", { class: "status" }, "Connecting…");
  const ac = new AbortController();
  main.append(h("h2", {}, "Events"), status,
    h("table", { id: "events" }, h("thead", {}, h("tr", {}, ...["Time", "Type", "Sandbox", "Reason", "Detail", "Labels"].map((c) => h("th", {}, c)))), tbody));
  (async () => {
    try {
      const since = BigInt(Date.now() - 3600_000);
      for await (const r of observe.events({ sinceMs: since }, { signal: ac.signal })) {
        if (r.kind.case === "live") status.textContent = "Live.";
        if (r.kind.case !== "event") continue;
        const e = r.kind.value;
        const type = (EventType[e.type] ?? String(e.type)).toLowerCase().replace(/_/g, " ");
        const detail = e.detail || (e.type === EventType.EXEC_ENDED ? `exit ${e.exitCode}` : "");
        tbody.insertBefore(h("tr", {}, h("td", {}, time(e.timeMs)), h("td", {}, type),
          h("td", {}, e.sandboxName || e.sandboxId), h("td", {}, e.reason), h("td", {}, detail), h("td", {}, labelsText(e.labels))), tbody.firstChild);
        while (tbody.childNodes.length > 500) tbody.removeChild(tbody.lastChild!);
      }
    } catch (e) {
      if (!ac.signal.aborted) status.textContent = "Stream ended: " + errText(e);
    }
  })();
  return () => ac.abort();
}
