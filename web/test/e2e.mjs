// End-to-end test of the dashboard in a real browser: Playwright
// (playwright-core) driving Debian's chromium, headless, against a real
// daemon (sdk/ts/test/daemon.mjs: $SBX_ADDR or bin/sbx serve started here).
// Logs in (a wrong token first: refused), creates a sandbox, sees it listed,
// opens its page, waits for the graphs to gain points and the logs to follow, runs `echo hi` in
// the terminal and reads it back, uploads, edits and downloads a file, and
// destroys the sandbox; fails on any CSP violation or page error. Prints the
// first-load time and the bundle's size. With SCREENSHOTS=DIR, saves a
// screenshot of each page there (make screenshots: docs/ui).
import { chromium } from "playwright-core";
import { readdirSync, readFileSync, statSync, mkdirSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { join } from "node:path";
import { execFileSync } from "node:child_process";
import assert from "node:assert/strict";
import { startDaemon, REPO } from "../../sdk/ts/test/daemon.mjs";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const shots = process.env.SCREENSHOTS;
if (shots) mkdirSync(shots, { recursive: true });

function bundleSize() {
  const dir = join(REPO, "internal/ui/dist/assets");
  let raw = 0, gz = 0;
  for (const f of readdirSync(dir)) {
    const b = readFileSync(join(dir, f));
    raw += statSync(join(dir, f)).size;
    gz += gzipSync(b, { level: 9 }).length;
  }
  const index = readFileSync(join(REPO, "internal/ui/dist/index.html"));
  return { raw: raw + index.length, gz: gz + gzipSync(index).length };
}

const step = (s) => console.log("e2e:", s);

// unary calls a unary RPC with JSON.
async function unary(base, tok, path, body) {
  const r = await fetch(`${base}/${path}`, {
    method: "POST", headers: { "Content-Type": "application/json", Authorization: `Bearer ${tok}` }, body: JSON.stringify(body) });
  const out = await r.json();
  if (!r.ok) throw new Error(`${path}: ${r.status} ${JSON.stringify(out)}`);
  return out;
}

// clientStream sends a client-streaming RPC's messages (JSON) in one body.
async function clientStream(base, tok, path, msgs) {
  const parts = msgs.map((m) => {
    const b = Buffer.from(JSON.stringify(m));
    const e = Buffer.alloc(5);
    e.writeUInt32BE(b.length, 1);
    return Buffer.concat([e, b]);
  });
  const r = await fetch(`${base}/${path}`, {
    method: "POST", headers: { "Content-Type": "application/connect+json", Authorization: `Bearer ${tok}` }, body: Buffer.concat(parts) });
  const buf = Buffer.from(await r.arrayBuffer());
  for (let i = 0; i + 5 <= buf.length; ) {
    const n = buf.readUInt32BE(i + 1);
    const m = JSON.parse(buf.subarray(i + 5, i + 5 + n).toString());
    if (buf[i] & 2 && m.error) throw new Error(`${path}: ${JSON.stringify(m.error)}`);
    i += 5 + n;
  }
}

// execIn runs a shell command in a sandbox through the Exec RPC (a Connect
// server stream, JSON) and returns its stdout.
async function execIn(base, tok, sandbox, shell) {
  const msg = Buffer.from(JSON.stringify({ sandbox, shell }));
  const env = Buffer.alloc(5);
  env.writeUInt32BE(msg.length, 1);
  const r = await fetch(`${base}/sbx.v1.SandboxService/Exec`, {
    method: "POST", headers: { "Content-Type": "application/connect+json", Authorization: `Bearer ${tok}` },
    body: Buffer.concat([env, msg]) });
  const buf = Buffer.from(await r.arrayBuffer());
  let out = "";
  for (let i = 0; i + 5 <= buf.length; ) {
    const n = buf.readUInt32BE(i + 1);
    const m = JSON.parse(buf.subarray(i + 5, i + 5 + n).toString());
    i += 5 + n;
    if (m.error) throw new Error(`exec ${shell}: ${JSON.stringify(m.error)}`);
    if (m.stdout) out += Buffer.from(m.stdout, "base64").toString();
    if (m.exited && m.exited.exitCode) throw new Error(`exec ${shell}: exit ${m.exited.exitCode}`);
  }
  return out;
}

// A server in the sandbox whose every response says Service-Worker-Allowed: /
// (a service worker it registers could then take the whole origin, the
// dashboard included, when its pages are proxied by path).
const swServer = `
import http.server
class H(http.server.SimpleHTTPRequestHandler):
    def end_headers(self):
        self.send_header("Service-Worker-Allowed", "/")
        if self.path.startswith("/clear"):
            self.send_header("Clear-Site-Data", '"storage"')
        super().end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
`;

// A sandbox's page that tries to act as the user who opens it: it reads
// the dashboard's token where the dashboard keeps it, calls the API with
// it (or the browser's cookies) on its own origin and on the dashboard's,
// frames the dashboard to read its storage, and opens the terminal
// WebSocket. It records what worked ("ok ...") in body[data-result].
const stealPage = `<!doctype html><meta charset="utf-8"><title>box</title><body><p>a sandbox page</p><iframe id="f" width="10" height="10"></iframe><script src="steal.js"></script></body>`;
function stealScript(dashboard, box) {
  return `(async () => {
  const dash = ${JSON.stringify(dashboard)};
  const out = {};
  try { out.token = sessionStorage.getItem("sbx.token"); } catch (e) { out.token = null; }
  const list = async (u) => {
    try {
      const h = { "Content-Type": "application/json" };
      if (out.token) h.Authorization = "Bearer " + out.token;
      const r = await fetch(u + "/sbx.v1.SandboxService/ListSandboxes", { method: "POST", headers: h, body: "{}", credentials: "include" });
      return r.ok ? "ok " + (await r.text()).slice(0, 80) : r.status;
    } catch (e) { return "refused: " + e; }
  };
  out.sameOriginAPI = await list("");
  out.dashboardAPI = await list(dash);
  const term = (u) => new Promise((res) => {
    let ws;
    try { ws = new WebSocket(u.replace(/^http/, "ws") + "/ui/exec"); } catch (e) { return res("refused: " + e); }
    ws.binaryType = "arraybuffer";
    let got = "";
    ws.onopen = () => ws.send(JSON.stringify({ token: out.token || "", sandbox: ${JSON.stringify(box)}, argv: ["id"] }));
    ws.onmessage = (ev) => { got += typeof ev.data === "string" ? ev.data : new TextDecoder().decode(ev.data); };
    ws.onclose = (ev) => res(/uid=/.test(got) ? "ok " + got : "closed " + ev.code + " " + got.slice(0, 80));
    setTimeout(() => { try { ws.close(); } catch (e) {} res("timeout " + got.slice(0, 80)); }, 10000);
  });
  out.sameOriginTerminal = await term(location.origin);
  out.dashboardTerminal = await term(dash);
  out.dashboardFrame = await new Promise((res) => {
    const f = document.getElementById("f");
    f.onload = () => { try { res("ok " + f.contentWindow.sessionStorage.getItem("sbx.token")); } catch (e) { res("refused: " + e.name); } };
    f.src = dash + "/ui/";
    setTimeout(() => res("no load"), 5000);
  });
  document.body.dataset.result = JSON.stringify(out);
})();
`;
}

const daemon = await startDaemon();
if (daemon.skip) {
  console.log("e2e: skipped:", daemon.skip);
  process.exit(0);
}
const base = `http://${daemon.addr}`; // the API listener: the API and sandbox ports
const ui = `http://${daemon.uiAddr}`; // the dashboard's own origin
const name = `ui-e2e-${process.pid}`;
let browser;
let page;
let failed = false;
try {
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  page = await ctx.newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => {
    if (m.type() === "error" && /Content Security Policy|Refused to/.test(m.text())) problems.push("console: " + m.text());
  });
  page.on("dialog", (d) => d.accept());
  if (process.env.E2E_DEBUG) page.on("console", (m) => console.log("browser:", m.type(), m.text()));
  if (process.env.E2E_DEBUG) page.on("requestfailed", (r) => console.log("browser: request failed", r.url(), r.failure()?.errorText));

  // First load: navigation to the login form, cold cache.
  const t0 = performance.now();
  await page.goto(ui + "/ui/");
  await page.locator("#login").waitFor();
  const firstLoad = performance.now() - t0;
  const nav = await page.evaluate(() => {
    const e = performance.getEntriesByType("navigation")[0];
    // Bodies as they came over the wire (encoded: gzipped where served so).
    let wire = e.encodedBodySize;
    for (const r of performance.getEntriesByType("resource")) wire += r.encodedBodySize;
    return { domContentLoaded: e.domContentLoadedEventEnd, load: e.loadEventEnd, wire };
  });
  const firstWire = nav.wire;
  if (shots) await page.screenshot({ path: join(shots, "login.png") });

  step("a wrong token is refused");
  await page.fill("#token", "not-the-token");
  await page.click("#login button[type=submit]");
  await page.locator("#login-error", { hasText: "Refused" }).waitFor();
  const unauth = await page.evaluate(async () => (await fetch("/sbx.v1.SandboxService/ListSandboxes", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" })).status);
  assert.equal(unauth, 401, "the API without a token");

  step("log in");
  await page.fill("#token", daemon.token);
  await page.click("#login button[type=submit]");
  await page.locator("#sandboxes").waitFor();

  step("create a sandbox and see it listed");
  await page.fill("#create-name", name);
  await page.fill("#create-labels", "suite=ui,hostile=<img src=x onerror=alert(1)>");
  await page.fill("#create-command", 'i=0; while :; do echo "tick $i"; i=$((i+1)); sleep 1; done');
  await page.click("#create button[type=submit]");
  const row = page.locator("#sandboxes tr", { hasText: name });
  await row.waitFor({ timeout: 60_000 });
  await page.locator("#sandboxes tr", { hasText: name }).locator("td", { hasText: "running" }).waitFor({ timeout: 60_000 });
  // Labels are text, not markup.
  assert.equal(await page.locator("#sandboxes img").count(), 0, "a label became an element");
  await page.fill("#filter-labels", "suite=ui");
  await page.locator("#filter-labels").press("Enter");
  await row.waitFor();
  if (shots) await page.screenshot({ path: join(shots, "sandboxes.png") });

  step("open its page; the graphs gain points");
  await row.locator("a").first().click();
  await page.locator("#sandbox-title", { hasText: name }).waitFor();
  const points = async () => Number(await page.locator("#graph-cpu svg").getAttribute("data-points"));
  await page.waitForFunction(() => Number(document.querySelector("#graph-cpu svg")?.getAttribute("data-points")) >= 2, null, { timeout: 60_000 });
  const p1 = await points();
  await page.waitForFunction((n) => Number(document.querySelector("#graph-cpu svg")?.getAttribute("data-points")) > n, p1, { timeout: 60_000 });
  step(`graph points ${p1} -> ${await points()}`);

  step("its logs follow");
  await page.locator("#logs", { hasText: "tick 2" }).waitFor({ timeout: 30_000 });

  step("run echo hi in the terminal");
  await page.locator("#terminal[data-state=open]").waitFor({ timeout: 30_000 });
  await page.locator("#terminal .xterm").click();
  await page.keyboard.type("echo hi\n");
  await page.waitForFunction(() => [...document.querySelectorAll("#terminal .xterm-rows > div")].some((r) => r.textContent.trim() === "hi"), null, { timeout: 30_000 });

  step("a busy loop shows on the CPU graph");
  // An idle box shows 0-1 millicores; the loop gets what a loaded machine
  // leaves it (tens of millicores at load 30 on 2 cores), for 3 samples.
  const idleMax = Number(await page.locator("#graph-cpu svg").getAttribute("data-max"));
  await page.keyboard.type("timeout 15 sh -c 'while :; do :; done'\n");
  await page.waitForFunction((idle) => Number(document.querySelector("#graph-cpu svg")?.getAttribute("data-max")) >= Math.max(20, 10 * idle), idleMax, { timeout: 45_000 });
  step(`CPU graph max ${await page.locator("#graph-cpu svg").getAttribute("data-max")} millicores`);

  step("a hostile file name is shown as text");
  await execIn(base, daemon.token, name, "touch '/tmp/<img src=x onerror=alert(1)>'");
  await page.click("#files form button[type=submit]");
  await page.locator("#file-list tr", { hasText: "<img src=x onerror=alert(1)>" }).waitFor();
  assert.equal(await page.locator("#file-list img").count(), 0, "a file name became an element");

  step("upload, edit and download a file");
  const content = "hello from the browser\n";
  await page.locator("#files-upload").setInputFiles({ name: "up.txt", mimeType: "text/plain", buffer: Buffer.from(content) });
  await page.locator("#files-status", { hasText: "Uploaded up.txt" }).waitFor();
  await page.locator('#file-list tr[data-name="up.txt"]').waitFor();
  let [dl] = await Promise.all([page.waitForEvent("download"), page.click('button.download[data-name="up.txt"]')]);
  assert.equal(readFileSync(await dl.path(), "utf8"), content, "downloaded file");
  await page.click('button.edit[data-name="up.txt"]');
  await page.locator("#editor-text").fill("edited\n");
  await page.click("#editor-save");
  await page.locator("#files-status", { hasText: "Saved" }).waitFor();
  [dl] = await Promise.all([page.waitForEvent("download"), page.click('button.download[data-name="up.txt"]')]);
  assert.equal(readFileSync(await dl.path(), "utf8"), "edited\n", "downloaded file after the edit");
  if (shots) await page.screenshot({ path: join(shots, "sandbox.png"), fullPage: true });

  step("a sandbox's page proxied by path cannot take the origin with a service worker");
  await execIn(base, daemon.token, name, "mkdir -p /tmp/www && cd /tmp/www && " +
    "printf 'self.addEventListener(\"fetch\", () => {});\\n' > sw.js && echo '<p>hi</p>' > index.html && " +
    `printf '%s' '${swServer.replace(/'/g, "'\\''")}' > /tmp/sw.py && ` +
    "(setsid python3 /tmp/sw.py </dev/null >/dev/null 2>&1 &)");
  const boxCtx = await browser.newContext();
  try {
    const box = await boxCtx.newPage();
    const prefix = `/proxy/${name}/8000`;
    for (let i = 0; ; i++) {
      const r = await box.goto(`${base}${prefix}/?sbx_token=${daemon.token}`);
      if (r.status() === 200) break;
      if (i > 100) throw new Error(`the sandbox's server did not come up: ${r.status()}`);
      await box.waitForTimeout(100);
    }
    const sw = await box.evaluate(async (p) => {
      const h = (await fetch(p + "/sw.js")).headers;
      const clear = (await fetch(p + "/clear")).headers.get("Clear-Site-Data");
      let reg;
      try {
        reg = await navigator.serviceWorker.register(p + "/sw.js", { scope: "/" });
      } catch (e) {
        reg = String(e);
      }
      return { allowed: h.get("Service-Worker-Allowed"), clear, reg: typeof reg === "string" ? reg : "registered with scope " + reg.scope };
    }, prefix);
    step(`service worker: ${sw.reg}`);
    assert.equal(sw.allowed, null, "Service-Worker-Allowed reached the browser");
    assert.equal(sw.clear, null, "Clear-Site-Data reached the browser");
    assert.match(sw.reg, /SecurityError|scope/i, "a service worker registration");
    assert.doesNotMatch(sw.reg, /^registered/, "a sandbox's service worker took scope /");
  } finally {
    await boxCtx.close();
  }

  step("a sandbox's page opened in the dashboard's tab cannot read the token nor call the API as the user");
  // The user, logged in, follows a link to the sandbox's port in the same
  // tab: the page's script looks for the dashboard's token (sessionStorage
  // of its origin), calls the API with it or with the browser's cookies, on
  // its own origin and the dashboard's, and opens the dashboard's terminal.
  await execIn(base, daemon.token, name, "cd /tmp/www && " +
    `printf '%s' '${stealPage.replace(/'/g, "'\\''")}' > steal.html && ` +
    `printf '%s' '${stealScript(ui, name).replace(/'/g, "'\\''")}' > steal.js`);
  const before = problems.length;
  await page.goto(`${base}/proxy/${name}/8000/steal.html?sbx_token=${daemon.token}`);
  await page.waitForFunction(() => document.body?.dataset.result, null, { timeout: 30_000 });
  const stolen = JSON.parse(await page.evaluate(() => document.body.dataset.result));
  step(`the sandbox's page got: ${JSON.stringify(stolen)}`);
  assert.equal(stolen.token, null, "the sandbox's page read the dashboard's token");
  for (const k of ["sameOriginAPI", "dashboardAPI", "sameOriginTerminal", "dashboardTerminal", "dashboardFrame"]) {
    assert.doesNotMatch(String(stolen[k]), /^ok/, `the sandbox's page got through: ${k}`);
  }
  assert.equal(stolen.sameOriginAPI, 401, "the API on the sandbox page's origin, with what it found");
  // The dashboard refusing to be framed is the browser reporting the
  // attack's failure, not a fault of the dashboard.
  for (const p of problems.splice(before)) assert.match(p, /frame-ancestors/, "a problem during the sandbox page's attack");
  await page.goto(ui + "/ui/#/sandboxes");
  await page.locator("#sandboxes tr", { hasText: name }).waitFor();

  step("a snapshot image, a volume and a codebase for their pages");
  const made = { images: `ui-e2e-snap-${process.pid}:latest`, volumes: `ui-e2e-vol-${process.pid}`, codebases: `ui-e2e-code-${process.pid}` };
  await unary(base, daemon.token, "sbx.v1.SandboxService/SnapshotSandbox", { sandbox: name, tag: made.images });
  await unary(base, daemon.token, "sbx.v1.VolumeService/CreateVolume", { name: made.volumes });
  const tar = execFileSync("tar", ["-c", "-C", join(REPO, "web"), "index.html", "package.json"]);
  await clientStream(base, daemon.token, "sbx.v1.CodebaseService/CreateCodebase", [{ header: { name: made.codebases } }, { data: tar.toString("base64") }]);

  for (const p of ["images", "volumes", "codebases", "events"]) {
    step(`${p} page`);
    await page.goto(`${ui}/ui/#/${p}`);
    await page.locator(`#${p} tbody tr`, { hasText: made[p] ?? name }).first().waitFor();
    if (shots) await page.screenshot({ path: join(shots, `${p}.png`) });
  }

  step("stop and start it");
  await page.goto(`${ui}/ui/#/sandboxes`);
  await page.locator("#sandboxes tr", { hasText: name }).locator("button.stop").click();
  await page.locator("#sandboxes tr", { hasText: name }).locator("td", { hasText: "stopped" }).waitFor({ timeout: 30_000 });
  await page.locator("#sandboxes tr", { hasText: name }).locator("button.start").click();
  await page.locator("#sandboxes tr", { hasText: name }).locator("td", { hasText: "running" }).waitFor({ timeout: 30_000 });

  step("destroy it");
  await page.locator("#sandboxes tr", { hasText: name }).locator("button.danger").click();
  await page.locator("#sandboxes tr", { hasText: name }).waitFor({ state: "detached", timeout: 60_000 });

  // First loads again, each in a fresh context (cold cache), for a median.
  const loads = [firstLoad];
  for (let i = 0; i < 4; i++) {
    const c = await browser.newContext();
    const p = await c.newPage();
    const t = performance.now();
    await p.goto(ui + "/ui/");
    await p.locator("#login").waitFor();
    loads.push(performance.now() - t);
    await c.close();
  }
  loads.sort((a, b) => a - b);

  assert.deepEqual(problems, [], "CSP violations or page errors");
  const size = bundleSize();
  console.log(`e2e: first load to the login form, cold cache: median ${loads[2].toFixed(0)} ms of 5 (${loads.map((x) => x.toFixed(0)).join(", ")}); the first: DOMContentLoaded ${nav.domContentLoaded.toFixed(0)} ms, load ${nav.load.toFixed(0)} ms`);
  console.log(`e2e: bundle ${(size.raw / 1024).toFixed(1)} KiB, ${(size.gz / 1024).toFixed(1)} KiB gzipped; the login page moves ${(firstWire / 1024).toFixed(1)} KiB of bodies over the wire`);
  console.log("e2e: ok");
} catch (e) {
  failed = true;
  console.error("e2e: FAILED:", e);
  const statuses = await page?.locator(".status, .error").allTextContents().catch(() => []);
  console.error("e2e: the page's status lines:", statuses);
} finally {
  await browser?.close();
  await daemon.stop(async () => {
    for (const [path, body] of [["sbx.v1.ImageService/RemoveImage", { ref: `ui-e2e-snap-${process.pid}:latest` }],
      ["sbx.v1.VolumeService/RemoveVolume", { name: `ui-e2e-vol-${process.pid}` }],
      ["sbx.v1.CodebaseService/DeleteCodebase", { codebase: `ui-e2e-code-${process.pid}` }]]) {
      await unary(base, daemon.token, path, body).catch(() => {});
    }
    const r = await fetch(`${base}/sbx.v1.SandboxService/DestroySandbox`, {
      method: "POST", headers: { "Content-Type": "application/json", Authorization: `Bearer ${daemon.token}` },
      body: JSON.stringify({ sandbox: name }) });
    await r.body?.cancel();
  });
}
process.exit(failed ? 1 : 0);
