// Tar transfers, image builds (recipe and Dockerfile), import/export and
// tenants against real daemons. Imports the package by name (the packed
// tarball under scripts/test-ts-sdk.sh).
import assert from "node:assert/strict";
import { lstatSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  Client, FailedPreconditionError, InvalidArgumentError, NotFoundError, PermissionDeniedError, Recipe,
  Sandbox, SbxError, UnsafeArchiveError,
} from "@sbxdev/sbx";

import { startDaemon } from "./daemon.mjs";

const RUN = `tsxfer-${process.pid}`;
let d;
let client;
let sb;
let tmp;

before(async () => {
  d = await startDaemon();
  if (d.skip) {
    return;
  }
  tmp = mkdtempSync(join(tmpdir(), "sbx-ts-xfer-"));
  client = new Client({ addr: d.addr, token: d.token });
  sb = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, timeout: 600 });
});

after(async () => {
  if (!d || d.skip) {
    return;
  }
  rmSync(tmp, { recursive: true, force: true });
  await d.stop(async () => {
    for (const s of await Sandbox.list({ client, selectors: [`sbx-ts-test=${RUN}`] })) {
      await s.terminate().catch(() => undefined);
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

describe("directories as tar", () => {
  it("uploads a directory tree and downloads it back, links included", async (t) => {
    if (skip(t)) return;
    const src = join(tmp, "src");
    mkdirSync(join(src, "a/b"), { recursive: true });
    writeFileSync(join(src, "top.txt"), "top");
    writeFileSync(join(src, "a/b/deep.bin"), new Uint8Array(300_000).map((_, i) => i % 256));
    const long = "n".repeat(120);
    writeFileSync(join(src, "a", long), "long name");
    symlinkSync("b/deep.bin", join(src, "a/link"));
    // Files: the two regular ones, the long-named one and the link.
    assert.equal(await sb.files.uploadDir(src, "/tmp/up"), 4);
    const r = await sb.run(`cd /tmp/up && cat top.txt a/${long} && readlink a/link && wc -c < a/b/deep.bin`);
    assert.equal(r.stdout, "toplong nameb/deep.bin\n300000\n", r.stderr);

    const dst = join(tmp, "dst");
    const got = await sb.files.downloadDir("/tmp/up", dst);
    assert.deepEqual(got.skipped, []);
    assert.equal(readFileSync(join(dst, "top.txt"), "utf8"), "top");
    assert.equal(readFileSync(join(dst, "a", long), "utf8"), "long name");
    assert.deepEqual(readFileSync(join(dst, "a/b/deep.bin")), readFileSync(join(src, "a/b/deep.bin")));
    assert.equal(readlinkSync(join(dst, "a/link")), "b/deep.bin");
  });

  it("extracts what a hostile sandbox sends without leaving the destination", async (t) => {
    if (skip(t)) return;
    // The box plants links out of the tree; a download must not follow them.
    await sb.run("mkdir -p /tmp/evil && cd /tmp/evil && ln -sf /etc/passwd abs && ln -sf ../../../../outside rel && echo ok > fine");
    const dst = join(tmp, "evil");
    const got = await sb.files.downloadDir("/tmp/evil", dst);
    assert.deepEqual(got.skipped.sort(), ["abs", "rel"]);
    assert.equal(readFileSync(join(dst, "fine"), "utf8"), "ok\n");
    assert.throws(() => lstatSync(join(dst, "abs")), /ENOENT/);
    // A chain of links, each inside on its own: l -> s/x/.. reads as "s",
    // but s/x -> .. makes it the destination's parent.
    await sb.run("rm -rf /tmp/chain && mkdir -p /tmp/chain/s && cd /tmp/chain && ln -s s/x/.. l && ln -s .. s/x");
    const chain = await sb.files.downloadDir("/tmp/chain", join(tmp, "chain"));
    assert.deepEqual(chain.skipped, ["l"]);
    assert.equal(readlinkSync(join(tmp, "chain/s/x")), "..");
    assert.throws(() => lstatSync(join(tmp, "chain/l")), /ENOENT/);
    // An archive the box crafted: each entry tries another way out.
    const { safeExtract } = await import("@sbxdev/sbx");
    const cases = [
      ["below a symlink", "add(sym('x', 'y')); add(reg('x/pwned'))", /below a symlink/],
      // The link leaves the tree, so it is not made; x/pwned lands in dest/x.
      ["below an outward symlink", "add(sym('x', '/tmp')); add(reg('x/pwned'))", null, ["x"]],
      // Lexically inside ("s"), but through s/x -> .. (made after it) it is
      // the destination's parent: not made.
      ["a chain of links out", "add(sym('l', 's/x/..')); add(sym('s/x', '..'))", null, ["l"]],
      ["absolute", "add(reg('/tmp/pwned'))", /absolute path/],
      ["dotdot", "add(reg('a/../../pwned'))", /contains '\.\.'/],
      ["device", "i = tarfile.TarInfo('dev'); i.type = tarfile.CHRTYPE; i.devmajor = 1; i.devminor = 3; add(i)", /device nodes/],
      ["hard link out", "add(lnk('h', '../../etc/passwd'))", /contains '\.\.'|leaves the destination/],
    ];
    for (const [name, adds, want, wantSkipped] of cases) {
      const py = [
        "import io, tarfile",
        "t = tarfile.open('/tmp/crafted.tar', 'w', format=tarfile.PAX_FORMAT)",
        "def add(i): t.addfile(i, io.BytesIO(b'pwn') if i.isreg() else None)",
        "def reg(n): i = tarfile.TarInfo(n); i.size = 3; return i",
        "def sym(n, to): i = tarfile.TarInfo(n); i.type = tarfile.SYMTYPE; i.linkname = to; return i",
        "def lnk(n, to): i = tarfile.TarInfo(n); i.type = tarfile.LNKTYPE; i.linkname = to; return i",
        adds,
        "t.close()",
      ].join("\n");
      const made = await sb.run(["python3", "-c", py]);
      assert.equal(made.exitCode, 0, made.stderr);
      const victim = join(tmp, `crafted-${name}`);
      const crafted = await sb.files.read("/tmp/crafted.tar");
      if (want === null) {
        const skipped = [];
        safeExtract(crafted, victim, skipped);
        assert.deepEqual(skipped, wantSkipped, name);
        for (const s of skipped) {
          let isLink = false;
          try {
            isLink = lstatSync(join(victim, s)).isSymbolicLink();
          } catch {
            // not there at all
          }
          assert.equal(isLink, false, `${name}: the link ${s} was made`);
        }
        continue;
      }
      assert.throws(() => safeExtract(crafted, victim),
        (e) => e instanceof UnsafeArchiveError && want.test(e.message), name);
    }
    assert.throws(() => lstatSync("/tmp/pwned"), /ENOENT/);
    assert.throws(() => lstatSync(join(tmp, "pwned")), /ENOENT/);
  });

  it("names a missing path", async (t) => {
    if (skip(t)) return;
    await assert.rejects(sb.files.downloadTar("/no/such/dir"), NotFoundError);
    await assert.rejects(sb.files.uploadTar("/tmp/x", new TextEncoder().encode("not a tar".repeat(100))), SbxError);
  });
});

describe("images", () => {
  it("builds from a recipe and from a Dockerfile, exports and imports", async (t) => {
    if (skip(t)) return;
    await sb.run("mkdir -p /opt/base && echo base > /opt/base/marker");
    const base = `localhost/ts/base-${process.pid}:v1`;
    await sb.snapshot(base);

    const app = join(tmp, "app");
    mkdirSync(app, { recursive: true });
    writeFileSync(join(app, "main.py"), "print('hello from the image')\n");
    const recipe = new Recipe(base).env({ GREETING: "hi" }).copyLocal(app, "/app").workdir("/app")
      .run("echo $GREETING > /app/greeting && cat /opt/base/marker >> /app/greeting");
    const tag = `localhost/ts/built-${process.pid}:v1`;
    const events = [];
    const img = await client.images.build(recipe, { tag, progress: (e) => events.push(e) });
    assert.equal(img.ref, tag);
    assert.match(img.digest, /^sha256:/);
    assert.ok(events.some((e) => e.kind === "step" && e.phase === "done"), JSON.stringify(events.map((e) => e.kind)));
    const box = await Sandbox.create({ client, image: tag, labels: { "sbx-ts-test": RUN } });
    assert.equal((await box.run("python3 main.py; cat greeting")).stdout, "hello from the image\nhi\nbase\n");
    await box.terminate();
    events.length = 0;
    assert.equal((await client.images.build(recipe, { tag, progress: (e) => events.push(e) })).digest, img.digest);
    assert.ok(events.filter((e) => e.kind === "step").every((e) => e.phase === "cached"), "the second build was not cached");

    const ctx = join(tmp, "ctx");
    mkdirSync(join(ctx, "app"), { recursive: true });
    writeFileSync(join(ctx, "app", "run.sh"), "echo from dockerfile\n");
    writeFileSync(join(ctx, "app", "secret.key"), "do not send");
    writeFileSync(join(ctx, ".dockerignore"), "**/*.key\n");
    writeFileSync(join(ctx, "Dockerfile"), "ARG BASE\nFROM $BASE\nARG WHO=nobody\nWORKDIR /srv\nCOPY app/ ./\nRUN echo $WHO > who\n");
    const dtag = `localhost/ts/df-${process.pid}:v1`;
    const dimg = await client.images.build({ dockerfile: join(ctx, "Dockerfile"), buildArgs: { BASE: base, WHO: "ts" } }, { tag: dtag });
    assert.equal(dimg.ref, dtag);
    const dbox = await Sandbox.create({ client, image: dtag, labels: { "sbx-ts-test": RUN } });
    assert.equal((await dbox.run("sh run.sh; cat who; ls")).stdout, "from dockerfile\nts\nrun.sh\nwho\n");
    await dbox.terminate();

    // Sandbox.create builds it itself (from the cache: the same steps).
    const made = await Sandbox.create({ client, dockerfile: join(ctx, "Dockerfile"), buildArgs: { BASE: base, WHO: "ts" }, labels: { "sbx-ts-test": RUN } });
    assert.match(made.info.image, /^localhost\/sbx-dockerfile\/[0-9a-f]{16}:latest$/);
    assert.equal((await made.run("cat who")).stdout, "ts\n");
    await made.terminate();
    await assert.rejects(Sandbox.create({ client, image: base, dockerfile: join(ctx, "Dockerfile") }), /an image or a dockerfile, not both/);

    const tarball = await client.images.export(dtag);
    assert.ok(tarball.length > 1000, `export gave ${tarball.length} bytes`);
    const copy = `localhost/ts/copy-${process.pid}:v1`;
    const [imported] = await client.images.importTar(tarball, { tag: copy });
    assert.equal(imported.ref, copy);
    assert.ok((await client.images.list()).some((i) => i.ref === copy));
    await client.images.remove(copy);
    await assert.rejects(client.images.get(copy), NotFoundError);
    assert.ok((await client.images.diskUsage()) > 0);
  });

  it("names what is wrong with a bad recipe, Dockerfile or archive", async (t) => {
    if (skip(t)) return;
    assert.throws(() => new Recipe(""), /base image must not be empty/);
    assert.throws(() => new Recipe().aptInstall(), /aptInstall: want one or more package names/);
    assert.throws(() => new Recipe().run("  "), /run: empty command/);
    assert.throws(() => new Recipe().copyLocal(join(tmp, "missing"), "/x"), /no such file or directory/);
    await assert.rejects(client.images.build(new Recipe("host").run("true")), (e) => e instanceof InvalidArgumentError && /host/.test(e.message));
    await sb.snapshot(`localhost/ts/bad-${process.pid}:v1`);
    await assert.rejects(client.images.build(new Recipe(`localhost/ts/bad-${process.pid}:v1`).run("echo boom >&2; exit 3")),
      (e) => e instanceof FailedPreconditionError && /boom/.test(e.message));
    const ctx = join(tmp, "badctx");
    mkdirSync(ctx, { recursive: true });
    writeFileSync(join(ctx, "Dockerfile"), `FROM localhost/ts/bad-${process.pid}:v1\nRUN true\nHEALTHCHECK CMD true\n`);
    await assert.rejects(client.images.build({ dockerfile: join(ctx, "Dockerfile") }),
      (e) => e instanceof InvalidArgumentError && /HEALTHCHECK/.test(e.message) && /line 3/.test(e.message));
    await assert.rejects(client.images.importTar(new TextEncoder().encode("this is not a tarball".repeat(100))), SbxError);
    await assert.rejects(client.images.export("no-such-image:latest"), NotFoundError);
  });
});

describe("tenants", () => {
  it("report the token's tenant and keep one tenant's sandboxes from another", async (t) => {
    if (skip(t)) return;
    const td = await startDaemon({ tenants: ["acme", "beta"] });
    const acme = new Client({ addr: td.addr, token: td.tokens.acme });
    const beta = new Client({ addr: td.addr, token: td.tokens.beta });
    const admin = new Client({ addr: td.addr, token: td.admin });
    try {
      const mine = await acme.tenant();
      assert.deepEqual([mine.name, mine.quotas.maxSandboxes], ["acme", 8]);
      const box = await Sandbox.create({ client: acme });
      assert.equal((await acme.tenants.current()).usage.sandboxes, 1);
      // Another tenant's sandbox reads exactly as a missing one (no oracle).
      const other = await Sandbox.fromId(box.id, { client: beta }).catch((e) => e);
      const missing = await Sandbox.fromId("sb-0000000000ff", { client: beta }).catch((e) => e);
      assert.ok(other instanceof NotFoundError, String(other));
      assert.equal(other.message.replaceAll(box.id, "X"), missing.message.replaceAll("sb-0000000000ff", "X"));
      // Names are per tenant.
      const named = await Sandbox.create({ client: acme, name: "dev" });
      const bnamed = await Sandbox.create({ client: beta, name: "dev" });
      assert.notEqual(named.id, bnamed.id);
      await bnamed.terminate();
      await named.terminate();
      // Scoped tokens reach the daemon through the network gateway: none here.
      await assert.rejects(Sandbox.create({ client: acme, scopedToken: true }),
        (e) => e instanceof FailedPreconditionError && /scoped_token/.test(e.message));
      await assert.rejects(beta.tenants.get("acme"), (e) => e instanceof PermissionDeniedError || e instanceof NotFoundError);
      await assert.rejects(beta.tenants.list(), PermissionDeniedError);
      assert.deepEqual((await admin.tenants.list()).map((x) => x.name).sort(), ["acme", "beta"]);
      await box.terminate();
    } finally {
      await td.stop(async () => {
        for (const s of await Sandbox.list({ client: acme })) await s.terminate().catch(() => undefined);
      });
    }
  });
});
