import { h, clear, labelsText } from "./dom";
import { sandboxes, errText } from "./api";
import { SandboxState, type Sandbox } from "@gen/sandbox_pb.js";

export function stateName(s: SandboxState): string {
  return (SandboxState[s] ?? String(s)).toLowerCase();
}

function parseLabels(s: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of s.split(",")) {
    const p = part.trim();
    if (!p) continue;
    const i = p.indexOf("=");
    if (i <= 0) throw new Error(`label ${JSON.stringify(p)}: want key=value`);
    out[p.slice(0, i)] = p.slice(i + 1);
  }
  return out;
}

export function sandboxesPage(main: HTMLElement): () => void {
  const selector = h("input", { id: "filter-labels", placeholder: "labels: app=web,env!=prod" });
  const state = h("select", { id: "filter-state" }, h("option", { value: "" }, "any state"),
    ...["running", "stopped", "creating", "failed"].map((s) => h("option", { value: s }, s)));
  const runtime = h("input", { id: "filter-runtime", placeholder: "runtime" });
  const status = h("p", { class: "status" });
  const tbody = h("tbody", {});
  const image = h("input", { id: "create-image", value: "host", placeholder: "image" });
  const name = h("input", { id: "create-name", placeholder: "name (optional)" });
  const labels = h("input", { id: "create-labels", placeholder: "labels k=v,k2=v2" });
  const command = h("input", { id: "create-command", placeholder: "command (sh -c, optional)" });
  const create = h("form", { id: "create", class: "row" }, image, name, labels, command, h("button", { type: "submit" }, "Create"));
  const ac = new AbortController();

  async function refresh(): Promise<void> {
    try {
      const sel = selector.value.split(",").map((s) => s.trim()).filter(Boolean);
      const resp = await sandboxes.listSandboxes({ selectors: sel }, { signal: ac.signal });
      render(resp.sandboxes);
      status.textContent = "";
    } catch (e) {
      if (!ac.signal.aborted) status.textContent = "List failed: " + errText(e);
    }
  }

  function render(list: Sandbox[]): void {
    clear(tbody);
    const st = state.value;
    const rt = runtime.value.trim();
    for (const sb of list) {
      if (st && stateName(sb.state) !== st) continue;
      if (rt && sb.runtime !== rt) continue;
      const destroy = h("button", { class: "danger", "data-id": sb.id }, "Destroy");
      destroy.addEventListener("click", async () => {
        if (!confirm(`Destroy sandbox ${sb.name || sb.id}?`)) return;
        destroy.setAttribute("disabled", "");
        try {
          await sandboxes.destroySandbox({ sandbox: sb.id });
        } catch (e) {
          status.textContent = "Destroy failed: " + errText(e);
        }
        void refresh();
      });
      const running = sb.state === SandboxState.RUNNING;
      const toggle = h("button", { class: running ? "stop" : "start" }, running ? "Stop" : "Start");
      if (!running && sb.state !== SandboxState.STOPPED) toggle.setAttribute("disabled", "");
      toggle.addEventListener("click", async () => {
        toggle.setAttribute("disabled", "");
        try {
          if (running) await sandboxes.stopSandbox({ sandbox: sb.id });
          else await sandboxes.startSandbox({ sandbox: sb.id });
        } catch (e) {
          status.textContent = (running ? "Stop" : "Start") + " failed: " + errText(e);
        }
        void refresh();
      });
      tbody.appendChild(h("tr", { "data-id": sb.id },
        h("td", {}, h("a", { href: "#/sandbox/" + encodeURIComponent(sb.id) }, sb.name || sb.id)),
        h("td", { class: "mono" }, sb.id),
        h("td", { class: "state-" + stateName(sb.state) }, stateName(sb.state)),
        h("td", {}, sb.runtime),
        h("td", {}, sb.image),
        h("td", {}, labelsText(sb.labels)),
        h("td", { class: "actions" }, toggle, " ", destroy)));
    }
    if (!tbody.firstChild) tbody.appendChild(h("tr", {}, h("td", { colspan: 7, class: "empty" }, "No sandboxes.")));
  }

  create.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const resp = await sandboxes.createSandbox({ image: image.value.trim(), name: name.value.trim(), labels: parseLabels(labels.value),
        command: command.value.trim() ? ["/bin/sh", "-c", command.value] : [] });
      status.textContent = `Created ${resp.sandbox?.name || resp.sandbox?.id}.`;
      name.value = "";
      command.value = "";
    } catch (e) {
      status.textContent = "Create failed: " + errText(e);
    }
    void refresh();
  });
  for (const el of [selector, runtime]) el.addEventListener("change", () => void refresh());
  state.addEventListener("change", () => void refresh());

  main.append(
    h("h2", {}, "Sandboxes"),
    create,
    h("div", { class: "row filters" }, selector, state, runtime),
    status,
    h("table", { id: "sandboxes" },
      h("thead", {}, h("tr", {}, ...["Name", "ID", "State", "Runtime", "Image", "Labels", ""].map((t) => h("th", {}, t)))),
      tbody));
  void refresh();
  const timer = setInterval(() => void refresh(), 3000);
  return () => {
    clearInterval(timer);
    ac.abort();
  };
}
