// The SDK against a real daemon: sandboxes, exec with streaming and stdin,
// files, code and contexts, sessions, ports, volumes, codebases, images,
// errors. Imports the package by name: scripts/test-ts-sdk.sh runs these
// against the tarball `npm pack` made.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { Client, InvalidArgumentError, NotFoundError, Sandbox, SbxError, UnauthenticatedError } from "@sbxdev/sbx";

import { startDaemon } from "./daemon.mjs";

const RUN = `ts-${process.pid}`;
let d;
let client;
let sb;

before(async () => {
  d = await startDaemon();
  if (d.skip) {
    return;
  }
  client = new Client({ addr: d.addr, token: d.token });
  sb = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, timeout: 600, memory: "256M", env: { GREETING: "hi" } });
});

after(async () => {
  if (!d || d.skip) {
    return;
  }
  await d.stop(async () => {
    for (const s of await Sandbox.list({ client, selectors: [`sbx-ts-test=${RUN}`] })) {
      await s.terminate().catch(() => undefined);
    }
    for (const v of await client.volumes.list()) {
      await client.volumes.remove(v.name).catch(() => undefined);
    }
  });
});

function skip(t) {
  if (d.skip) {
    t.skip(d.skip);
    return true;
  }
  return false;
}

describe("sandboxes", () => {
  it("creates, finds by id, name and label, and destroys", async (t) => {
    if (skip(t)) return;
    assert.equal(sb.state, "running");
    const named = await Sandbox.create({ client, name: `ts-${process.pid}`, labels: { "sbx-ts-test": RUN, role: "named" } });
    assert.equal((await Sandbox.fromId(named.id, { client })).name, named.name);
    assert.equal((await Sandbox.fromName(named.name, { client })).id, named.id);
    const listed = await Sandbox.list({ client, labels: { role: "named" } });
    assert.deepEqual(listed.map((s) => s.id), [named.id]);
    await named.update({ setLabels: { role: "renamed" }, timeout: 120 });
    assert.equal(named.info.labels.role, "renamed");
    assert.ok(named.info.expiresAt && named.info.expiresAt.getTime() - Date.now() <= 120_000, `expires ${named.info.expiresAt}`);
    await named.terminate();
    await assert.rejects(Sandbox.fromId(named.id, { client }), NotFoundError);
  });

  it("refuses a wrong token and names a bad argument", async (t) => {
    if (skip(t)) return;
    const bad = new Client({ addr: d.addr, token: "not-the-token" });
    await assert.rejects(Sandbox.list({ client: bad }), UnauthenticatedError);
    await assert.rejects(Sandbox.create({ client, name: "Not A Valid Name!" }), (e) => e instanceof InvalidArgumentError && /name/.test(e.message));
  });
});

describe("updates", () => {
  it("change limits, labels and the lifetime, and refuse bad values naming them", async (t) => {
    if (skip(t)) return;
    const box = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN, a: "1" }, memory: "128M", pids: 128 });
    await box.update({ memory: "256M", cpu: 1, pids: 300 });
    assert.deepEqual(box.info.resources, { memoryBytes: 256 * 2 ** 20, cpu: 1, pids: 300, diskBytes: box.info.resources.diskBytes });
    await box.setLabels({ b: "2" });
    assert.deepEqual([box.info.labels.a, box.info.labels.b], ["1", "2"]);
    await box.update({ setLabels: { "sbx-ts-test": RUN, only: "me" }, replaceLabels: true });
    assert.deepEqual(box.info.labels, { "sbx-ts-test": RUN, only: "me" });
    await box.setTimeout(30);
    assert.ok(box.info.expiresAt.getTime() - Date.now() <= 30_000, `expires ${box.info.expiresAt}`);
    await assert.rejects(box.update({ memory: "1T" }), (e) => e instanceof InvalidArgumentError && /memory/.test(e.message));
    await assert.rejects(box.update({ cpu: 0 }), (e) => e instanceof RangeError && /cpu 0/.test(e.message));
    await assert.rejects(box.update({ timeout: -1 }), (e) => e instanceof RangeError && /timeout -1/.test(e.message));
    await assert.rejects(box.update({ setLabels: { "bad key!": "x" } }), (e) => e instanceof InvalidArgumentError && /bad key/.test(e.message));
    await box.terminate();
  });

  it("resume a stopped sandbox on use with autoResume", async (t) => {
    if (skip(t)) return;
    const box = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, autoResume: true });
    assert.equal(box.info.autoResume, true);
    await box.stop();
    assert.equal((await box.refresh()).state, "stopped");
    assert.equal((await box.run("echo back")).stdout, "back\n");
    assert.equal((await box.refresh()).state, "running");
    await box.update({ autoResume: false });
    assert.equal(box.info.autoResume, false);
    await box.terminate();
  });
});

describe("permission rules", () => {
  it("guard a directory as the rules say and refuse bad ones naming them", async (t) => {
    if (skip(t)) return;
    const policy = { path: "/workspace", preset: "development", rules: [{ pattern: "/docs", permission: "read", type: "directory" }] };
    const box = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, pathPolicies: [policy] });
    assert.deepEqual(box.info.pathPolicies, [{ ...policy, default: undefined, rules: [{ ...policy.rules[0], priority: undefined, caseInsensitive: undefined }] }]);
    const r = await box.run("cd /workspace && echo s > .env; echo rc=$?; echo ok > a.txt && cat a.txt && mkdir docs");
    assert.doesNotMatch(r.stdout, /rc=0/); // .env is hidden: it cannot be created
    assert.match(r.stderr, /cannot create .env: Permission denied/);
    assert.notEqual(r.exitCode, 0); // docs/ is read-only: mkdir fails
    assert.deepEqual((await box.files.list("/workspace")).map((f) => f.name), ["a.txt"]);
    await assert.rejects(box.files.write("/workspace/.env", "x"), SbxError);
    await box.terminate();
    await assert.rejects(Sandbox.create({ client, pathPolicies: [{ path: "/workspace", preset: "nope" }] }),
      (e) => e instanceof InvalidArgumentError && /nope/.test(e.message));
    await assert.rejects(Sandbox.create({ client, pathPolicies: [{ path: "relative" }] }),
      (e) => e instanceof InvalidArgumentError && /relative/.test(e.message));
    await assert.rejects(Sandbox.create({ client, pathPolicies: [{ path: "/w", rules: [{ pattern: "*.pem", permission: "hidden" }] }] }),
      (e) => e instanceof RangeError && /"hidden"/.test(e.message));
  });
});

describe("the sandbox's own command", () => {
  it("streams its logs and reports how it ended", async (t) => {
    if (skip(t)) return;
    const box = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, command: ["sh", "-c", "echo out; echo err >&2; exit 7"] });
    const status = await box.wait();
    assert.equal(status.exitCode, 7);
    const chunks = [];
    for await (const c of box.logs()) {
      chunks.push(`${c.stream}:${c.text}`);
    }
    assert.deepEqual(chunks.sort(), ["stderr:err\n", "stdout:out\n"]);
    await box.terminate();
  });
});

describe("exec", () => {
  it("runs shell lines and argv with env, cwd and stdin", async (t) => {
    if (skip(t)) return;
    const r = await sb.run("echo $GREETING $EXTRA; pwd; echo oops >&2; exit 3", { env: { EXTRA: "there" }, cwd: "/tmp" });
    assert.deepEqual([r.stdout, r.stderr, r.exitCode], ["hi there\n/tmp\n", "oops\n", 3]);
    const argv = await sb.run(["tr", "a-z", "A-Z"], { stdin: "shout" });
    assert.deepEqual([argv.stdout, argv.exitCode], ["SHOUT", 0]);
  });

  it("streams output as it is printed", async (t) => {
    if (skip(t)) return;
    const seen = [];
    let firstAt = 0;
    const started = Date.now();
    const r = await sb.run("echo one; sleep 1; echo two", {
      onStdout: (c) => {
        seen.push(new TextDecoder().decode(c));
        firstAt ||= Date.now();
      },
    });
    assert.equal(seen.join(""), "one\ntwo\n");
    assert.equal(r.stdout, "one\ntwo\n");
    // "one" arrived before the command ended, not with its end.
    assert.ok(firstAt - started < Date.now() - started - 500, `first chunk after ${firstAt - started} ms of ${Date.now() - started}`);
  });

  it("keeps stdin open for an interactive process", async (t) => {
    if (skip(t)) return;
    const chunks = [];
    const p = sb.exec(["sh", "-c", "while read -r l; do echo got:$l; done; echo eof"], { onStdout: (c) => chunks.push(c) });
    p.writeStdin("a\n");
    p.writeStdin(new TextEncoder().encode("b\n"));
    p.closeStdin();
    const r = await p.wait();
    assert.deepEqual([r.stdout, r.exitCode], ["got:a\ngot:b\neof\n", 0]);
    assert.ok(r.pid > 0, `pid ${r.pid}`);

    const sleeper = sb.exec(["sleep", "60"]);
    sleeper.kill(9);
    const k = await sleeper.wait();
    assert.equal(k.signal, 9, `got ${JSON.stringify(k)}`);
  });

  it("kills a command at its timeout", async (t) => {
    if (skip(t)) return;
    const r = await sb.run("sleep 30", { timeout: 1 });
    assert.equal(r.timedOut, true);
  });
});

describe("files", () => {
  it("writes, reads, lists, stats, renames and removes", async (t) => {
    if (skip(t)) return;
    const big = new Uint8Array(3 * (1 << 20) + 7).map((_, i) => i % 251);
    assert.equal(await sb.files.write("/tmp/ts/big.bin", big), big.length);
    assert.deepEqual(await sb.files.read("/tmp/ts/big.bin"), big);
    assert.deepEqual(await sb.files.read("/tmp/ts/big.bin", { offset: 10, length: 5 }), big.subarray(10, 15));
    await sb.files.write("/tmp/ts/a.txt", "hello", { mode: 0o600 });
    assert.equal(await sb.files.readText("/tmp/ts/a.txt"), "hello");
    const st = await sb.files.stat("/tmp/ts/a.txt");
    assert.deepEqual([st.type, st.size, st.mode & 0o777], ["file", 5, 0o600]);
    const names = (await sb.files.list("/tmp/ts")).map((f) => f.name).sort();
    assert.deepEqual(names, ["a.txt", "big.bin"]);
    await sb.files.rename("/tmp/ts/a.txt", "/tmp/ts/b.txt");
    assert.equal(await sb.files.exists("/tmp/ts/a.txt"), false);
    await sb.files.makeDir("/tmp/ts/d/e");
    assert.equal((await sb.files.stat("/tmp/ts/d/e")).type, "dir");
    await sb.files.remove("/tmp/ts", { recursive: true });
    assert.equal(await sb.files.exists("/tmp/ts"), false);
    await assert.rejects(sb.files.read("/tmp/nope"), NotFoundError);
  });
});

describe("watching a directory", () => {
  it("yields creates, writes and removes as an async iterator", async (t) => {
    if (skip(t)) return;
    // Each change is one rename or unlink in the box (atomic: a poll sees
    // before or after), and waits for the watcher to report the one before.
    await sb.run("mkdir -p /tmp/watched/sub /tmp/staging && echo one > /tmp/staging/a && echo one-more > /tmp/staging/b");
    const ac = new AbortController();
    const seen = [];
    let ready;
    const listed = new Promise((r) => (ready = r));
    const it = sb.files.watch("/tmp/watched", { recursive: true, intervalMs: 100, signal: ac.signal, onReady: ready });
    const first = it.next(); // the first listing is taken on the first next()
    await listed;
    await sb.run("mv /tmp/staging/a /tmp/watched/sub/a.txt");
    seen.push((await first).value);
    await sb.run("mv /tmp/staging/b /tmp/watched/sub/a.txt");
    seen.push((await it.next()).value);
    await sb.run("rm /tmp/watched/sub/a.txt");
    seen.push((await it.next()).value);
    ac.abort();
    assert.equal((await it.next()).done, true);
    assert.deepEqual(seen.map((e) => [e.type, e.path]), [
      ["create", "/tmp/watched/sub/a.txt"], ["write", "/tmp/watched/sub/a.txt"], ["remove", "/tmp/watched/sub/a.txt"],
    ]);
    assert.equal(seen[1].info.size, 9);
    await assert.rejects(sb.files.watch("/tmp/no-such-dir").next(), NotFoundError);
    await assert.rejects(sb.files.watch("/tmp", { intervalMs: 1 }).next(), /intervalMs 1: want 100 or more/);
  });
});

describe("code", () => {
  it("runs python and returns a matplotlib figure as a PNG artifact", async (t) => {
    if (skip(t)) return;
    const r = await sb.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2], [2, 1])\nplt.show()\nprint('plotted')\n");
    assert.equal(r.stdout, "plotted\n", r.stderr);
    assert.equal(r.ok, true);
    const png = r.artifacts.find((a) => a.mime === "image/png");
    assert.ok(png, `artifacts ${JSON.stringify(r.artifacts.map((a) => a.mime))}`);
    assert.deepEqual([...png.content.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
    assert.equal(r.plots.length, 1);
    const bad = await sb.runCode("1/0");
    assert.equal(bad.ok, false);
    assert.match(bad.stderr, /ZeroDivisionError/);
  });

  it("keeps state in a context", async (t) => {
    if (skip(t)) return;
    const ctx = await sb.createContext("python");
    await ctx.run("x = 41");
    const r = await ctx.run("x + 1");
    assert.equal(r.value?.text, "42");
    assert.ok((await sb.listContexts()).some((c) => c.id === ctx.id));
    await ctx.close();
    assert.ok(!(await sb.listContexts()).some((c) => c.id === ctx.id));
  });
});

describe("sessions", () => {
  it("keeps the shell's state between commands", async (t) => {
    if (skip(t)) return;
    const s = await sb.session();
    await s.exec("cd /tmp && export X=kept");
    const r = await s.exec("pwd; echo $X");
    assert.deepEqual([r.stdout, r.exitCode], ["/tmp\nkept\n", 0]);
    assert.ok((await sb.listSessions()).some((x) => x.id === s.id));
    await s.close();
  });
});

describe("ports", () => {
  it("gives the URL of a server in the sandbox, which answers through the daemon", async (t) => {
    if (skip(t)) return;
    await sb.files.write("/tmp/www/index.html", "served");
    const server = sb.exec(["python3", "-m", "http.server", "8123", "--bind", "127.0.0.1", "--directory", "/tmp/www"]);
    try {
      // Wait until the server listens (the daemon lists listening ports).
      const deadline = Date.now() + 20_000;
      while (!(await sb.ports()).some((p) => p.port === 8123)) {
        assert.ok(Date.now() < deadline, "the server never listened on 8123");
        await new Promise((r) => setTimeout(r, 100));
      }
      const p = await sb.getPort(8123);
      assert.equal(p.port, 8123);
      const res = await fetch(p.url, { headers: { Authorization: `Bearer ${d.token}` } });
      assert.equal(await res.text(), "served");
      // The routing headers reach it at the daemon's own address too.
      const byHeaders = await fetch(`http://${d.addr}/`, { headers: { ...p.headers, Authorization: `Bearer ${d.token}` } });
      assert.equal(await byHeaders.text(), "served");
    } finally {
      server.kill(9);
      await server.wait().catch(() => undefined);
    }
  });
});

describe("volumes and codebases", () => {
  it("mounts a volume whose files outlive the sandbox", async (t) => {
    if (skip(t)) return;
    const name = `tsvol${process.pid}`;
    const v = await client.volumes.create(name, { size: "16M" });
    assert.equal(v.name, name);
    const a = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, volumes: [{ volume: name, path: "/data" }] });
    await a.files.write("/data/keep.txt", "persisted");
    await a.terminate();
    const b = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, volumes: [{ volume: name, path: "/data", readOnly: true }] });
    assert.equal(await b.files.readText("/data/keep.txt"), "persisted");
    await b.terminate();
    assert.ok((await client.volumes.list()).some((x) => x.name === name));
    await client.volumes.remove(name);
    await assert.rejects(client.volumes.get(name), NotFoundError);
  });

  it("creates a codebase from a tar, mounts it and syncs changes back", async (t) => {
    if (skip(t)) return;
    const dir = mkdtempSync(join(tmpdir(), "sbx-ts-cb-"));
    try {
      writeFileSync(join(dir, "main.py"), "print('v1')\n");
      const tar = execFileSync("tar", ["-c", "-C", dir, "."]);
      const name = `tscb${process.pid}`;
      const cb = await client.codebases.create(name, new Uint8Array(tar));
      assert.equal(cb.name, name);
      const box = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, codebases: [{ codebase: name, path: "/work" }] });
      assert.equal((await box.run("python3 /work/main.py")).stdout, "v1\n");
      await box.files.write("/work/new.txt", "from the box");
      const sync = await client.codebases.sync(box.id);
      assert.deepEqual(sync.written, ["new.txt"]);
      await box.terminate();
      const back = new Uint8Array(await client.codebases.download(name));
      assert.ok(Buffer.from(back).includes("from the box"), "the downloaded tar lacks the synced file");
      assert.ok((await client.codebases.list()).some((x) => x.name === name));
      await client.codebases.delete(name);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("images", () => {
  it("lists the store and reports a missing image", async (t) => {
    if (skip(t)) return;
    assert.ok(Array.isArray(await client.images.list()));
    await assert.rejects(client.images.get("no-such-image:latest"), NotFoundError);
  });
});
