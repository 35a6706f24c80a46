// A real sbx daemon for the tests: $SBX_ADDR (with $SBX_TOKEN) when one
// answers there, else bin/sbx serve started here on a free loopback port
// with a token, a temporary data dir and no warm pool (needs root). The
// repository is $SBX_REPO (scripts/test-ts-sdk.sh sets it), else ../../..
import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, openSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = process.env.SBX_REPO || resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
export const SBX_BIN = join(REPO, "bin", "sbx");

async function healthy(addr) {
  try {
    const r = await fetch(`http://${addr}/healthz`, { signal: AbortSignal.timeout(1000) });
    return r.status === 200;
  } catch {
    return false;
  }
}

function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
    s.on("error", rej);
  });
}

// nextPort is host:port's host with the port after it (the daemon's
// default --ui-listen).
function nextPort(addr) {
  const i = addr.lastIndexOf(":");
  return `${addr.slice(0, i)}:${Number(addr.slice(i + 1)) + 1}`;
}

/**
 * startDaemon returns { addr, uiAddr, token, stop() }, or { skip: reason }
 * when no daemon can be had (not root and no $SBX_ADDR). uiAddr is the web
 * dashboard's listener ($SBX_UI_ADDR, default the port after $SBX_ADDR's).
 * With opts.tenants (names), it always starts its own daemon with a tenants
 * file: then `tokens` maps each name to its token, `admin` is an admin token
 * and `token` is the first tenant's.
 */
export async function startDaemon(opts = {}) {
  if (!opts.tenants && process.env.SBX_ADDR && (await healthy(process.env.SBX_ADDR))) {
    return { addr: process.env.SBX_ADDR, uiAddr: process.env.SBX_UI_ADDR || nextPort(process.env.SBX_ADDR),
      token: process.env.SBX_TOKEN ?? "", stop: async () => {} };
  }
  if (process.getuid?.() !== 0) {
    return { skip: "the sbx daemon needs root (namespaces, cgroups, mounts): run as root or set SBX_ADDR" };
  }
  const dir = mkdtempSync(join(tmpdir(), "sbx-ts-test-"));
  chmodSync(dir, 0o711); // sandbox roots must be reachable by the mapped uids
  let token = randomBytes(24).toString("hex");
  let auth = ["--auth-token-file", join(dir, "token")];
  const tokens = {};
  let admin;
  if (opts.tenants) {
    const hash = (t) => "sha256:" + createHash("sha256").update(t).digest("hex");
    for (const name of opts.tenants) {
      tokens[name] = randomBytes(24).toString("hex");
    }
    admin = randomBytes(24).toString("hex");
    token = tokens[opts.tenants[0]];
    writeFileSync(join(dir, "tenants.json"), JSON.stringify({
      admin_tokens: [hash(admin)],
      tenants: opts.tenants.map((name) => ({ name, tokens: [hash(tokens[name])], quotas: { max_sandboxes: 8 } })),
    }), { mode: 0o600 });
    auth = ["--tenants", join(dir, "tenants.json")];
  } else {
    writeFileSync(join(dir, "token"), token + "\n", { mode: 0o600 });
  }
  const addr = `127.0.0.1:${await freePort()}`;
  const uiAddr = `127.0.0.1:${await freePort()}`;
  const log = join(dir, "daemon.log");
  const fd = openSync(log, "a");
  const proc = spawn(SBX_BIN, ["serve", "--listen", addr, "--data-dir", join(dir, "data"), "--warm-pool", "0",
    "--network=false", ...auth, "--ui-listen", uiAddr], { stdio: ["ignore", fd, fd], detached: true });
  let exited = false;
  proc.on("exit", () => (exited = true));
  const deadline = Date.now() + 30_000;
  while (!(await healthy(addr))) {
    if (exited || Date.now() > deadline) {
      const text = readFileSync(log, "utf8").slice(-4000);
      proc.kill("SIGKILL");
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`the daemon did not come up:\n${text}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    addr, uiAddr, token, tokens, admin, log,
    async stop(destroyAll) {
      // Sandboxes outlive the daemon: destroy them before stopping it.
      if (destroyAll) {
        try {
          await destroyAll();
        } catch (e) {
          console.error("destroying the test sandboxes:", e);
        }
      }
      if (!exited) {
        const gone = new Promise((r) => proc.once("exit", r));
        proc.kill("SIGTERM");
        const timer = setTimeout(() => proc.kill("SIGKILL"), 20_000);
        await gone;
        clearTimeout(timer);
      }
      if (process.env.SBX_TS_KEEP_LOG) {
        console.error(readFileSync(log, "utf8").slice(-8000));
      }
      // Never recurse into a mount a broken teardown left behind.
      const real = realpathSync(dir) + "/";
      const mounts = readFileSync("/proc/self/mounts", "utf8").split("\n").map((l) => l.split(" ")[1] ?? "");
      if (mounts.some((m) => m.startsWith(real))) {
        console.error(`leaving ${dir}: something is still mounted under it`);
        return;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
