// A scripted session of E2B's own unmodified SDKs against an sbx daemon.
// Only the environment points them at sbx: E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY. SBX_OTHER_KEY, when set, is another tenant's key: it must
// not see the sandbox. Each step prints "ok <step>"; a failure exits 1.
import assert from "node:assert/strict";
import { Sandbox as CodeSandbox } from "@e2b/code-interpreter";
import { Sandbox, CommandExitError, NotFoundError, SandboxNotFoundError, FilesystemEventType } from "e2b";

const t0 = Date.now();
let last = t0;
const ok = (step) => {
  const now = Date.now();
  console.log(`ok ${step} (${now - last} ms)`);
  last = now;
};
const dir = "/tmp/e2b-session";

const sbx = await CodeSandbox.create({ metadata: { suite: "e2b-compat" }, timeoutMs: 120_000 });
ok(`create ${sbx.sandboxId}`);
try {
  // commands.run with streamed output
  const streamed = [];
  const res = await sbx.commands.run("for i in 1 2 3; do echo line$i; done; echo oops >&2", {
    onStdout: (d) => streamed.push(d),
  });
  assert.equal(res.exitCode, 0);
  assert.equal(res.stdout, "line1\nline2\nline3\n");
  assert.equal(res.stderr, "oops\n");
  assert.equal(streamed.join(""), "line1\nline2\nline3\n");
  ok("commands.run streamed");

  // a failing command throws CommandExitError with its exit code
  await assert.rejects(sbx.commands.run("exit 3"), (e) => e instanceof CommandExitError && e.exitCode === 3);
  ok("commands.run exit code");

  // envs and cwd
  const env = await sbx.commands.run("echo $GREETING; pwd", { envs: { GREETING: "hi" }, cwd: "/tmp" });
  assert.equal(env.stdout, "hi\n/tmp\n");
  ok("commands.run envs cwd");

  // files: write, read, list, exists, makeDir, rename, remove
  const info = await sbx.files.write(`${dir}/hello.txt`, "hello from e2b\n");
  assert.equal(info.path, `${dir}/hello.txt`);
  assert.equal(await sbx.files.read(`${dir}/hello.txt`), "hello from e2b\n");
  const bytes = new Uint8Array(70000).map((_, i) => i % 251);
  await sbx.files.write(`${dir}/blob.bin`, bytes.buffer);
  const back = await sbx.files.read(`${dir}/blob.bin`, { format: "bytes" });
  assert.deepEqual(Buffer.from(back), Buffer.from(bytes));
  await sbx.files.write([{ path: `${dir}/multi/a.txt`, data: "A" }, { path: `${dir}/multi/b.txt`, data: "B" }]);
  const names = (await sbx.files.list(dir)).map((e) => `${e.name}:${e.type}`).sort();
  assert.deepEqual(names, ["blob.bin:file", "hello.txt:file", "multi:dir"]);
  assert.equal(await sbx.files.exists(`${dir}/hello.txt`), true);
  assert.equal(await sbx.files.exists(`${dir}/nope`), false);
  assert.equal(await sbx.files.makeDir(`${dir}/sub/deep`), true);
  assert.equal(await sbx.files.makeDir(`${dir}/sub/deep`), false);
  await sbx.files.rename(`${dir}/hello.txt`, `${dir}/sub/hello.txt`);
  assert.equal((await sbx.files.getInfo(`${dir}/sub/hello.txt`)).size, 15);
  await sbx.files.remove(`${dir}/sub`);
  assert.equal(await sbx.files.exists(`${dir}/sub`), false);
  await assert.rejects(sbx.files.read(`${dir}/missing.txt`), (e) => e instanceof NotFoundError);
  ok("files write read list stat mkdir rename remove");

  // watchDir (polling): a file created after the watch starts is reported
  const seen = [];
  let resolveSeen;
  const created = new Promise((r) => (resolveSeen = r));
  const watch = await sbx.files.watchDir(dir, (ev) => {
    seen.push(ev);
    if (ev.name === "watched.txt" && ev.type === FilesystemEventType.CREATE) resolveSeen();
  });
  await sbx.files.write(`${dir}/watched.txt`, "w");
  await created;
  await watch.stop();
  ok("files.watchDir");

  // a background command, then connect to it from another handle, then kill
  // A silent command: start and connect must answer at once, not when it
  // first writes (sbx's ConnectProcess answers then, or at its 10 s
  // keepalive), so each is bounded well under that.
  let since = Date.now();
  const bg = await sbx.commands.run("sleep 600", { background: true });
  assert.ok(Date.now() - since < 5000, `background start took ${Date.now() - since} ms`);
  const listed = await sbx.commands.list();
  assert.ok(listed.some((p) => p.pid === bg.pid), `pid ${bg.pid} in ${JSON.stringify(listed)}`);
  since = Date.now();
  const again = await sbx.commands.connect(bg.pid);
  assert.ok(Date.now() - since < 5000, `connect took ${Date.now() - since} ms`);
  assert.equal(again.pid, bg.pid);
  assert.equal(await sbx.commands.kill(bg.pid), true);
  const end = await bg.wait().then((r) => r, (e) => e);
  assert.ok(end instanceof CommandExitError || end.exitCode !== 0, `killed command ended with ${JSON.stringify(end)}`);
  assert.ok(!(await sbx.commands.list()).some((p) => p.pid === bg.pid));
  ok("background command connect kill");

  // stdin: a second handle connected to the command sees the output that
  // the input causes
  const reader = await sbx.commands.run("read line; echo got $line; cat", { background: true, stdin: true });
  const watcher = await sbx.commands.connect(reader.pid);
  await sbx.commands.sendStdin(reader.pid, "hi\n");
  await sbx.commands.closeStdin(reader.pid);
  const done = await watcher.wait();
  assert.equal(done.stdout, "got hi\n");
  assert.equal((await reader.wait()).stdout, "got hi\n");
  ok("stdin connect");

  // a PTY: output arrives as terminal data, resize and input work
  let term = "";
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (term += Buffer.from(d).toString()) });
  await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 });
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("stty size; echo pty-$((6*7)); exit\n"));
  await pty.wait().catch((e) => e);
  assert.match(term, /30 100/);
  assert.match(term, /pty-42/);
  ok("pty");

  // setTimeout and getInfo
  await sbx.setTimeout(90_000);
  const got = await sbx.getInfo();
  assert.equal(got.sandboxId, sbx.sandboxId);
  assert.equal(got.state, "running");
  assert.equal(got.metadata.suite, "e2b-compat");
  const left = got.endAt.getTime() - Date.now();
  assert.ok(left > 60_000 && left <= 91_000, `endAt ${got.endAt.toISOString()} is ${left} ms away, want about 90 s`);
  ok("setTimeout getInfo");

  // list with a metadata filter
  const page = await Sandbox.list({ query: { metadata: { suite: "e2b-compat" } } }).nextItems();
  assert.deepEqual(page.map((s) => s.sandboxId), [sbx.sandboxId]);
  assert.equal((await Sandbox.list({ query: { metadata: { suite: "other" } } }).nextItems()).length, 0);
  ok("list metadata");

  // runCode: stdout, the last expression, a matplotlib PNG, an error, a context
  const ex = await sbx.runCode("print('py out')\n6 * 7");
  assert.equal(ex.logs.stdout.join(""), "py out\n"); // chunks as the kernel wrote them
  assert.equal(ex.text, "42");
  const plot = await sbx.runCode("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()");
  const png = plot.results.find((r) => r.png);
  assert.ok(png, `no png in ${JSON.stringify(plot.results.map((r) => Object.keys(r.raw)))} (error ${JSON.stringify(plot.error)})`);
  assert.equal(Buffer.from(png.png, "base64").subarray(1, 4).toString(), "PNG");
  const bad = await sbx.runCode("undefined_name");
  assert.equal(bad.error?.name, "NameError");
  const ctx = await sbx.createCodeContext();
  await sbx.runCode("x = 41", { context: ctx });
  assert.equal((await sbx.runCode("x + 1", { context: ctx })).text, "42");
  await sbx.removeCodeContext(ctx.id);
  ok("runCode text png error context");

  // metrics
  const metrics = await sbx.getMetrics();
  assert.ok(Array.isArray(metrics));
  ok(`getMetrics ${metrics.length}`);

  // pause and resume (sbx: stop and start)
  assert.equal(await sbx.isRunning(), true);
  await sbx.pause();
  assert.equal((await sbx.getInfo()).state, "paused");
  assert.equal(await sbx.isRunning(), false);
  const resumed = await Sandbox.connect(sbx.sandboxId);
  assert.equal((await resumed.getInfo()).state, "running");
  assert.equal((await resumed.commands.run("echo back")).stdout, "back\n");
  ok("pause connect");

  // another tenant's key sees nothing of this sandbox
  if (process.env.SBX_OTHER_KEY) {
    const other = { apiKey: process.env.SBX_OTHER_KEY };
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, other), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError);
    await assert.rejects(Sandbox.connect(sbx.sandboxId, other), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError);
    assert.equal(await Sandbox.kill(sbx.sandboxId, other), false);
    assert.equal((await Sandbox.list(other).nextItems()).length, 0);
    // envd with the other key as its access token: the sandbox is not found
    const forged = await Sandbox.create({ ...other, timeoutMs: 60_000 });
    const stolen = new CodeSandbox({ ...forged.connectionConfig, sandboxId: sbx.sandboxId, envdAccessToken: process.env.SBX_OTHER_KEY, envdVersion: "0.5.7" });
    const notFound = (e) => /not found/i.test(e.message) || (console.error(e), false);
    await assert.rejects(stolen.files.read(`${dir}/blob.bin`), notFound);
    await assert.rejects(stolen.files.list(dir), notFound);
    await assert.rejects(stolen.commands.run("echo pwned"), notFound);
    await assert.rejects(stolen.runCode("1"), notFound);
    await forged.kill();
    assert.equal((await sbx.getInfo()).state, "running");
    ok("tenancy");
  }
} finally {
  await sbx.kill();
}
assert.equal(await Sandbox.kill(sbx.sandboxId), false);
assert.equal(await sbx.isRunning(), false);
await assert.rejects(Sandbox.getInfo(sbx.sandboxId), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError);
ok("kill");
