// Background processes, exec output as an async iterator, events and stats
// against a real daemon. Imports the package by name (the packed tarball
// under scripts/test-ts-sdk.sh).
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, FailedPreconditionError, InvalidArgumentError, NotFoundError, Sandbox } from "@sbxdev/sbx";

import { startDaemon } from "./daemon.mjs";

const RUN = `tsproc-${process.pid}`;
let d;
let client;
let sb;

before(async () => {
  d = await startDaemon();
  if (d.skip) {
    return;
  }
  client = new Client({ addr: d.addr, token: d.token });
  sb = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN }, timeout: 600, memory: "256M" });
});

after(async () => {
  if (!d || d.skip) {
    return;
  }
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

// until reads a background process's output until it contains want.
async function until(p, want) {
  let seen = "";
  for await (const o of p.output()) {
    seen += o.text;
    if (seen.includes(want)) {
      return seen;
    }
  }
  assert.fail(`the process ended without printing ${JSON.stringify(want)}; it printed ${JSON.stringify(seen)}`);
}

describe("background processes", () => {
  it("take stdin after the start, replay their output and outlive their client", async (t) => {
    if (skip(t)) return;
    const p = await sb.processes.start(["sh", "-c", "echo ready; while read -r l; do echo got:$l; done; echo bye; exit 4"], { stdin: true, tag: "reader" });
    assert.ok(p.pid > 0 && p.id && p.running && p.stdinOpen, JSON.stringify(p));
    assert.deepEqual(p.command, ["sh", "-c", "echo ready; while read -r l; do echo got:$l; done; echo bye; exit 4"]);
    await until(p, "ready");
    await p.sendStdin("one\n");
    await until(p, "got:one");

    // Another client finds it by pid, id and tag, and replays what it printed.
    const other = new Client({ addr: d.addr, token: d.token });
    const box = await Sandbox.fromId(sb.id, { client: other });
    for (const ref of [p.pid, p.id, "reader"]) {
      assert.equal((await box.processes.connect(ref)).id, p.id, `connect(${ref})`);
    }
    const q = await box.processes.connect("reader");
    assert.deepEqual(await q.collectOutput(), { stdout: "ready\ngot:one\n", stderr: "" });
    assert.ok((await box.processes.list()).some((x) => x.id === p.id));
    await q.sendStdin("two\n");
    await q.closeStdin();
    assert.equal(await q.wait(), 4);
    assert.equal(q.running, false);
    assert.equal((await p.refresh()).returncode, 4);
    assert.equal((await p.collectOutput()).stdout, "ready\ngot:one\ngot:two\nbye\n");
    assert.equal((await p.collectOutput({ tail: 1 })).stdout, "bye\n");
    await p.remove();
    await assert.rejects(box.processes.connect(p.id), NotFoundError);
  });

  it("run under a pty of the size asked, and resize", async (t) => {
    if (skip(t)) return;
    const p = await sb.processes.start("sh -i", { pty: true, rows: 20, cols: 70 });
    assert.ok(p.pty && p.stdinOpen);
    await p.sendStdin("stty size\n");
    await until(p, "20 70");
    await p.resize(33, 111);
    await p.sendStdin("stty size; echo $((6*7))\n");
    await until(p, "33 111");
    await p.sendStdin("exit 2\n");
    assert.equal(await p.wait({ timeout: 30 }), 2);
    await p.remove();
  });

  it("take signals by name and number", async (t) => {
    if (skip(t)) return;
    const p = await sb.processes.start(["sleep", "600"]);
    await p.signal("SIGTERM");
    assert.equal(await p.wait(), 143);
    assert.equal(p.exitStatus.signal, 15);
    const k = await sb.processes.start(["sleep", "600"]);
    await k.kill();
    assert.equal(await k.wait(), 137);
    await p.remove();
    await k.remove();
  });

  it("refuse bad requests with errors that name them", async (t) => {
    if (skip(t)) return;
    await assert.rejects(sb.processes.start([]), (e) => e instanceof RangeError && /empty/.test(e.message));
    await assert.rejects(sb.processes.start("true", { tag: "123" }), (e) => e instanceof InvalidArgumentError && /tag/.test(e.message));
    await assert.rejects(sb.processes.start(["/nonexistent/binary"]), FailedPreconditionError);
    await assert.rejects(sb.processes.connect(999999), NotFoundError);
    const p = await sb.processes.start(["sleep", "600"]);
    try {
      await assert.rejects(p.sendStdin("x"), (e) => e instanceof FailedPreconditionError && /stdin/.test(e.message));
      await assert.rejects(p.signal("NOPE"), (e) => e instanceof RangeError && /NOPE/.test(e.message));
      await assert.rejects(p.signal(0), RangeError);
    } finally {
      await p.remove();
    }
  });
});

describe("exec output as an async iterator", () => {
  it("yields stdout and stderr as printed, in order, and again from the start", async (t) => {
    if (skip(t)) return;
    // Each line waits for the test to have seen the one before: the order is the program's.
    const p = sb.exec(["sh", "-c", "echo a; read x; echo b >&2; read y; echo $y"]);
    const got = [];
    for await (const o of p.output()) {
      got.push(`${o.stream}:${o.text}`);
      if (o.text === "a\n") {
        p.writeStdin("go\n");
      } else if (o.text === "b\n") {
        p.writeStdin("c\n");
        p.closeStdin();
      }
    }
    assert.deepEqual(got, ["stdout:a\n", "stderr:b\n", "stdout:c\n"]);
    assert.equal((await p.wait()).exitCode, 0);
    const again = [];
    for await (const o of p.output()) {
      again.push(o.text);
    }
    assert.deepEqual(again, ["a\n", "b\n", "c\n"]);
  });
});

describe("events and stats", () => {
  it("follows the daemon's events for a sandbox and replays them", async (t) => {
    if (skip(t)) return;
    const ac = new AbortController();
    let live;
    const isLive = new Promise((r) => (live = r));
    const seen = [];
    const following = (async () => {
      for await (const ev of client.events({ types: ["created", "destroyed"], labels: [`evt=${RUN}`], onLive: live, signal: ac.signal })) {
        seen.push(ev);
        if (ev.type === "destroyed") {
          return;
        }
      }
    })();
    await isLive;
    const box = await Sandbox.create({ client, labels: { "sbx-ts-test": RUN, evt: RUN } });
    await box.terminate();
    await following;
    ac.abort();
    assert.deepEqual(seen.map((e) => [e.type, e.sandboxId]), [["created", box.id], ["destroyed", box.id]]);
    assert.equal(seen[1].reason, "user");
    // The same events replayed, without following.
    const replay = [];
    for await (const ev of client.events({ sandboxes: [box.id], types: ["created", "destroyed"], afterSeq: seen[0].seq - 1, follow: false })) {
      replay.push(ev.seq);
    }
    assert.deepEqual(replay, seen.map((e) => e.seq));
    const all = [];
    for await (const ev of client.events({ sandboxes: [box.id], since: new Date(0), follow: false })) {
      all.push(ev.type);
    }
    assert.ok(all.includes("created") && all.includes("destroyed"), `since the epoch replayed ${all}`);
    assert.throws(() => client.events({ afterSeq: 0.5 }), /afterSeq 0.5: want a whole number/);
    assert.throws(() => client.events({ types: ["nope"] }).next(), /unknown event type "nope"/);
  });

  it("reports a sandbox's live usage and the sampler's usage and limits", async (t) => {
    if (skip(t)) return;
    await sb.run("head -c 8000000 /dev/zero > /tmp/fill");
    const live = await sb.stats();
    assert.ok(live.memoryBytes > 0 && live.pids >= 1 && live.diskUsedBytes >= 8000000, JSON.stringify(live));
    // The sampler (every 5 s by default) knows the sandbox after its next round.
    const deadline = Date.now() + 30_000;
    let u;
    while (!(u = (await client.stats([sb.id]))[0])) {
      assert.ok(Date.now() < deadline, "the sampler never reported the sandbox");
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.equal(u.sandboxId, sb.id);
    assert.equal(u.memoryLimitBytes, 256 * 2 ** 20);
    assert.ok((await client.stats()).some((x) => x.sandboxId === sb.id));
    await assert.rejects(client.stats(["no-such-sandbox"]), NotFoundError);
  });
});
