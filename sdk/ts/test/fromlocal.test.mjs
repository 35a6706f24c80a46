// Codebases from a local directory (the ignore walker against the vectors
// shared with the Go and Python SDKs, hostile trees and names),
// Sandbox.fromLocal and sandbox.open's streams, against a real daemon.
// Imports the package by name (the packed tarball under
// scripts/test-ts-sdk.sh).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from "node:fs";
import { syncBuiltinESMExports } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { after, before, describe, it } from "node:test";

import {
  AlreadyExistsError, Client, IgnoreFileError, NotFoundError, ReplacedFileError, Sandbox, walkCodebase,
} from "@sbxdev/sbx";

import { REPO, startDaemon } from "./daemon.mjs";

const RUN = `tslocal-${process.pid}`;
let d;
let client;
let sb;
let tmp;

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), "sbx-ts-local-"));
  d = await startDaemon();
  if (d.skip) {
    return;
  }
  client = new Client({ addr: d.addr, token: d.token });
  sb = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, timeout: 600, memory: "256M" });
});

after(async () => {
  rmSync(tmp, { recursive: true, force: true });
  if (!d || d.skip) {
    return;
  }
  await d.stop(async () => {
    for (const s of await Sandbox.list({ client, selectors: [`sbx-ts-test=${RUN}`] })) {
      await s.terminate().catch(() => undefined);
    }
    for (const cb of await client.codebases.list()) {
      await client.codebases.delete(cb.id).catch(() => undefined);
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

let n = 0;
function fresh(name) {
  const p = join(tmp, `${name}-${n++}`);
  mkdirSync(p, { recursive: true });
  return p;
}

function build(root, files) {
  for (const [rel, content] of Object.entries(files)) {
    const full = join(root, rel);
    if (rel.endsWith("/")) {
      mkdirSync(full, { recursive: true });
      continue;
    }
    mkdirSync(dirname(full), { recursive: true });
    writeFileSync(full, content);
  }
}

/** The regular files of a tar (as the daemon sends it), name -> content. */
function tarFiles(tar) {
  const out = {};
  const dec = new TextDecoder();
  for (let off = 0; off + 512 <= tar.length;) {
    const h = tar.subarray(off, off + 512);
    if (h.every((b) => b === 0)) break;
    const field = (o, l) => { const s = h.subarray(o, o + l); const e = s.indexOf(0); return dec.decode(e < 0 ? s : s.subarray(0, e)); };
    const size = parseInt(field(124, 12).trim() || "0", 8);
    const type = String.fromCharCode(h[156] || 0x30);
    const prefix = field(345, 155);
    const name = (prefix ? `${prefix}/` : "") + field(0, 100);
    off += 512;
    if (type === "0") out[name.replace(/^\.\//, "")] = Buffer.from(tar.subarray(off, off + size));
    off += Math.ceil(size / 512) * 512;
  }
  return out;
}

describe("the codebase walker", () => {
  const vectors = JSON.parse(readFileSync(join(REPO, "sdk/testdata/codebase_ignore.json"), "utf8")).cases;
  for (const c of vectors) {
    it(`follows the shared vector: ${c.name}`, () => {
      const root = fresh("vec");
      build(root, c.files);
      const { files, skipped } = walkCodebase(root, {
        ignore: c.extra ?? [], includeGit: !c.no_git, maxFileBytes: c.max_file_bytes || undefined,
      });
      const got = files.filter((f) => !f.st.isDirectory()).map((f) => f.rel).sort();
      assert.deepEqual(got, c.included);
      assert.deepEqual(skipped.map((s) => s.path).sort(), [...(c.skipped ?? [])].sort());
    });
  }

  // A hostile tree's ignore files: the walker opens them for its own
  // reasons, so one that leads out of the tree, blocks or never ends must
  // be refused before it is opened. Each case would hang the walk (FIFO,
  // /dev/zero), or read a host file (the outside one: "*" would ignore
  // everything), if the file were opened by path.
  const outside = () => {
    const p = join(fresh("outside"), "secret");
    writeFileSync(p, "*\n");
    return p;
  };
  const cases = [
    ["a .gitignore symlinked out of the tree", (root) => symlinkSync(outside(), join(root, ".gitignore")), ".gitignore: is a symlink"],
    ["a .gitignore symlinked to /dev/zero", (root) => symlinkSync("/dev/zero", join(root, ".gitignore")), ".gitignore: is a symlink"],
    ["a .sandboxignore that is a FIFO", (root) => execFileSync("mkfifo", [join(root, ".sandboxignore")]), ".sandboxignore: is a FIFO"],
    ["a nested .gitignore symlinked to a FIFO", (root) => {
      mkdirSync(join(root, "sub"));
      execFileSync("mkfifo", [join(root, "fifo")]);
      symlinkSync("../fifo", join(root, "sub/.gitignore"));
    }, "sub/.gitignore: is a symlink"],
    ["a .gitignore over 1 MiB", (root) => writeFileSync(join(root, ".gitignore"), "#".repeat((1 << 20) + 1)), "more than the 1048576"],
  ];
  for (const [name, plant, want] of cases) {
    it(`refuses ${name} without opening it`, { timeout: 20_000 }, () => {
      const root = fresh("hostile");
      writeFileSync(join(root, "app.py"), "print(1)\n");
      plant(root);
      assert.throws(() => walkCodebase(root), (e) => e instanceof IgnoreFileError && e.message.includes(want),
        `want an IgnoreFileError naming "${want}"`);
      // Without ignore files, the same tree walks (the link is a link).
      const { files } = walkCodebase(root, { useIgnoreFiles: false });
      assert.ok(files.some((f) => f.rel === "app.py"));
    });
  }

  it("refuses a .dockerignore symlinked out of a build context before sending anything", { timeout: 20_000 }, async () => {
    const ctx = fresh("ctx");
    writeFileSync(join(ctx, "Dockerfile"), "FROM scratch\n");
    symlinkSync("/dev/zero", join(ctx, ".dockerignore"));
    // No daemon at this address: the refusal comes before any call.
    const nowhere = new Client({ addr: "127.0.0.1:1" });
    await assert.rejects(nowhere.images.build({ dockerfile: join(ctx, "Dockerfile") }),
      (e) => e instanceof IgnoreFileError && e.message.includes(".dockerignore: is a symlink"));
  });
});

describe("codebases from a local directory", () => {
  it("uploads what the ignore rules keep, reports what is skipped, and mounts it", async (t) => {
    if (skip(t)) return;
    const root = fresh("cb");
    build(root, {
      ".gitignore": "*.log\n", "app.py": "print('v1')\n", "debug.log": "noise", "huge.bin": "x".repeat(5000),
      "pkg/mod.py": "X = 1\n", "pkg/mod.pyc": "bytecode",
    });
    // Hostile names travel as they are: a newline, a leading dash, quotes,
    // non-ASCII, one longer than a ustar header holds.
    const odd = ["new\nline", "-rf", "it's \"q\"", "héllo wörld", "n".repeat(200)];
    for (const name of odd) writeFileSync(join(root, "pkg", name), name);
    // A name that is not UTF-8 is skipped and reported, not mangled.
    writeFileSync(Buffer.concat([Buffer.from(join(root, "pkg") + "/"), Buffer.from([0x66, 0xff, 0x6f])]), "latin");
    // Links are sent as links, never followed.
    symlinkSync("/etc/passwd", join(root, "passwd"));
    symlinkSync("app.py", join(root, "alias.py"));
    const cb = await client.codebases.fromLocal(root, { name: `tscb-${process.pid}`, ignore: ["pkg/*.pyc"], maxFileBytes: 1000 });
    assert.match(cb.id, /^cb-/);
    assert.deepEqual(cb.skipped.map((s) => [s.path, s.reason]).sort(), [
      ["huge.bin", "larger than 1000 bytes"], ["pkg/f\u00ffo", "name is not valid UTF-8"],
    ]);
    // Regular files: .gitignore, app.py, pkg/mod.py and the odd names.
    assert.equal(cb.fileCount, 3 + odd.length);
    const files = tarFiles(await client.codebases.download(cb.id));
    assert.equal(files["app.py"].toString(), "print('v1')\n");
    assert.ok(!("debug.log" in files) && !("pkg/mod.pyc" in files) && !("passwd" in files));

    const box = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, codebases: [{ codebase: cb.id, path: "/workspace" }] });
    const r = await box.run("cd /workspace && readlink passwd alias.py && cat alias.py");
    assert.equal(r.stdout, "/etc/passwd\napp.py\nprint('v1')\n", r.stderr);
    for (const name of odd) {
      const c = await box.run(["cat", `/workspace/pkg/${name}`]);
      assert.equal(c.stdout, name, c.stderr);
    }
    await box.terminate();
    await client.codebases.delete(cb.id);
  });

  it("Sandbox.fromLocal mounts it view-only and terminate deletes it", async (t) => {
    if (skip(t)) return;
    const root = fresh("fl");
    build(root, { "app.py": "print('app')\n", ".env": "TOKEN=x\n" });
    const box = await Sandbox.fromLocal(root, { client, labels: { "sbx-ts-test": RUN }, memory: "128M" });
    const ls = await box.run("ls -A /workspace");
    assert.equal(ls.stdout, ".env\napp.py\n"); // names are visible
    const cat = await box.run("cat /workspace/app.py");
    assert.notEqual(cat.exitCode, 0); // content is not
    assert.match(cat.stderr, /Permission denied/);
    assert.notEqual((await box.run("echo x > /workspace/new.py")).exitCode, 0);
    const cbs = (await client.codebases.list()).filter((c) => c.sandboxes.includes(box.id));
    assert.equal(cbs.length, 1);
    await box.terminate();
    await assert.rejects(client.codebases.get(cbs[0].id), NotFoundError);

    // preset "" is unguarded; a failed create deletes the codebase at once.
    const rw = await Sandbox.fromLocal(root, { client, labels: { "sbx-ts-test": RUN }, preset: "", mount: "/w" });
    assert.equal((await rw.run("cat /w/app.py && echo y > /w/new.py && cat /w/new.py")).stdout, "print('app')\ny\n");
    await rw.terminate();
    const before = (await client.codebases.list()).length;
    await assert.rejects(Sandbox.fromLocal(root, { client, memory: "not-a-size" }));
    await assert.rejects(Sandbox.fromLocal(root, { client, image: "Not A Reference!" }));
    assert.equal((await client.codebases.list()).length, before);
  });
});

describe("codebases.fromLocal while the directory is reshaped", () => {
  // A file or directory swapped for a symlink to a secret outside the tree
  // just after the walk looked at it: the upload fails naming it, and no
  // codebase holds the secret or the outside directory's names.
  const SECRET = "SECRET-OUTSIDE-THE-DIRECTORY";
  const swaps = {
    "file replaced by a link out (between walk and read)": ["f", (code, outside) => {
      unlinkSync(join(code, "f"));
      symlinkSync(join(outside, "secret"), join(code, "f"));
    }],
    "directory replaced by a link out before it is listed": ["d", (code, outside) => {
      rmSync(join(code, "d"), { recursive: true });
      symlinkSync(outside, join(code, "d"));
    }],
    "file replaced by a link to an ignored file inside": ["f", (code) => {
      unlinkSync(join(code, "f"));
      symlinkSync(".env", join(code, "f"));
    }],
  };
  for (const [name, [rel, swap]] of Object.entries(swaps)) {
    it(name, async (t) => {
      if (skip(t)) return;
      const base = fresh("swap");
      const code = join(base, "code");
      const outside = join(base, "outside");
      mkdirSync(join(code, "d"), { recursive: true });
      mkdirSync(outside);
      const pad = "x".repeat(SECRET.length); // as long as the secret: a size check alone passes
      writeFileSync(join(code, "f"), pad);
      writeFileSync(join(code, "d", "secret"), pad);
      writeFileSync(join(code, ".gitignore"), ".env\n");
      writeFileSync(join(code, ".env"), SECRET);
      writeFileSync(join(outside, "secret"), SECRET);
      writeFileSync(join(outside, "outside-only-name"), SECRET);
      const orig = fs.lstatSync;
      let done = false;
      fs.lstatSync = function (p, ...rest) {
        const st = orig.call(this, p, ...rest);
        if (!done && p === join(code, rel)) {
          done = true;
          swap(code, outside);
        }
        return st;
      };
      syncBuiltinESMExports();
      const cbName = `swap-${process.pid}-${n}`;
      try {
        await assert.rejects(client.codebases.fromLocal(code, { name: cbName }), ReplacedFileError);
      } finally {
        fs.lstatSync = orig;
        syncBuiltinESMExports();
      }
      assert.ok(done, "the swap was never made");
      await assert.rejects(client.codebases.get(cbName), NotFoundError);
    });
  }
});

describe("sandbox.open", () => {
  it("streams a write and a read of a file larger than one message", async (t) => {
    if (skip(t)) return;
    const blob = randomBytes(5 * (1 << 20) + 123);
    const w = await sb.open("/tmp/open/big.bin", "wb");
    for (let off = 0; off < blob.length; off += 300_000) {
      await w.write(blob.subarray(off, off + 300_000));
    }
    assert.equal(await w.close(), blob.length);
    const sum = (b) => createHash("sha256").update(b).digest("hex");
    const r = await box_sha(sb, "/tmp/open/big.bin");
    assert.equal(r, sum(blob));
    // Read back chunk by chunk: more than one chunk arrives.
    const f = await sb.open("/tmp/open/big.bin");
    const chunks = [];
    for await (const c of f) chunks.push(c);
    assert.ok(chunks.length > 1, `got ${chunks.length} chunks, want more than 1`);
    assert.equal(sum(Buffer.concat(chunks)), sum(blob));
  });

  it("pipes through web and Node streams", async (t) => {
    if (skip(t)) return;
    const w = await sb.open("/tmp/open/web.txt", "w");
    await Readable.toWeb(Readable.from(["a\n", "b\n", "c\n"])).pipeTo(w.writable);
    assert.equal(await sb.files.readText("/tmp/open/web.txt"), "a\nb\nc\n");
    const r = await sb.open("/tmp/open/web.txt");
    const parts = [];
    await r.readable.pipeTo(new WritableStream({ write: (c) => parts.push(Buffer.from(c)) }));
    assert.equal(Buffer.concat(parts).toString(), "a\nb\nc\n");

    const n = await sb.open("/tmp/open/node.txt", "x");
    await pipeline(Readable.from([Buffer.from("node "), Buffer.from("stream\n")]), n.nodeStream());
    const got = [];
    await pipeline((await sb.open("/tmp/open/node.txt")).nodeStream(), new Writable({
      write(c, _e, cb) { got.push(c); cb(); },
    }));
    assert.equal(Buffer.concat(got).toString(), "node stream\n");
  });

  it("appends, creates exclusively, truncates at open and refuses what open() would", async (t) => {
    if (skip(t)) return;
    const p = "/tmp/open/modes.txt";
    const a = await sb.open(p, "a");
    await a.write("one\n");
    await a.close();
    const a2 = await sb.open(p, "at");
    await a2.write("two\n");
    await a2.close();
    assert.equal(await (await sb.open(p)).text(), "one\ntwo\n");
    await assert.rejects(sb.open(p, "x"), AlreadyExistsError);
    await assert.rejects(sb.open(`${p}.missing`), NotFoundError);
    await assert.rejects(sb.open(p, "rw"), RangeError);
    await assert.rejects(sb.open(p, "r+"), /random access/);
    const rd = await sb.open(p);
    await assert.rejects(rd.write("x"), /not writable/);
    const w = await sb.open(p, "w");
    assert.equal(await sb.files.readText(p), ""); // w truncates at open, like open()
    await w.write("partial");
    await w.abort(new Error("changed my mind"));
    // An aborted w-stream leaves what open() left: not a part of the data.
    assert.equal(await sb.files.readText(p), "");
    const left = await sb.run("ls -A /tmp/open | grep -c sbx- || true");
    assert.equal(left.stdout.trim(), "0", "no temporary file is left behind");
    const m = await sb.open("/tmp/open/perm.sh", "w", { perm: 0o750 });
    await m.write("#!/bin/sh\necho ran\n");
    await m.close();
    assert.equal((await sb.run("/tmp/open/perm.sh")).stdout, "ran\n");
  });
});

describe("local files", () => {
  it("uploadFile and downloadFile stream whole files, modes and holes kept", async (t) => {
    if (skip(t)) return;
    const dir = fresh("files");
    const src = join(dir, "src.bin");
    const blob = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(3 << 20), randomBytes(4097)]);
    writeFileSync(src, blob, { mode: 0o751 });
    assert.equal(await sb.files.uploadFile(src, "/tmp/files/up.bin"), blob.length);
    const sum = (b) => createHash("sha256").update(b).digest("hex");
    assert.equal(await box_sha(sb, "/tmp/files/up.bin"), sum(blob));
    assert.equal((await sb.files.stat("/tmp/files/up.bin")).mode & 0o777, 0o751);
    const dst = join(dir, "dst.bin");
    assert.equal(await sb.files.downloadFile("/tmp/files/up.bin", dst), blob.length);
    assert.equal(sum(readFileSync(dst)), sum(blob));
    assert.ok(!existsSync(`${dst}.sbx-partial`));
    await assert.rejects(sb.files.downloadFile("/tmp/files/missing", join(dir, "m")), NotFoundError);
    assert.ok(!existsSync(join(dir, "m")) && !existsSync(join(dir, "m.sbx-partial")));
  });

  it("getHost is the port's URL", async (t) => {
    if (skip(t)) return;
    const p = await sb.getPort(8000);
    assert.equal(await sb.getHost(8000), p.hostUrl || p.url);
  });
});

async function box_sha(box, path) {
  const r = await box.run(["sha256sum", path]);
  return r.stdout.split(" ")[0];
}
