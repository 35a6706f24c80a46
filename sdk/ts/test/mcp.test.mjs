// sbx's MCP server driven by the official MCP TypeScript SDK's client, as
// an agent's host would: over stdio (`sbx mcp`) and over the daemon's
// streamable-HTTP endpoint (/mcp, with the daemon's token).
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

import { Client, Sandbox } from "@sbxdev/sbx";

import { SBX_BIN, startDaemon } from "./daemon.mjs";

let d;
let client;

before(async () => {
  d = await startDaemon();
  if (!d.skip) {
    client = new Client({ addr: d.addr, token: d.token });
  }
});

after(async () => {
  if (d && !d.skip) {
    await d.stop(async () => {
      for (const s of await Sandbox.list({ client, selectors: ["sbx-mcp=1"] })) {
        await s.terminate().catch(() => undefined);
      }
    });
  }
});

function json(res) {
  assert.ok(!res.isError, `tool error: ${res.content?.[0]?.text}`);
  return JSON.parse(res.content[0].text);
}

// session drives one sandbox through the tools an agent needs.
async function session(mcp) {
  const { tools } = await mcp.listTools();
  const names = tools.map((t) => t.name);
  for (const want of ["create_sandbox", "list_sandboxes", "destroy_sandbox", "exec", "run_code", "read_file", "write_file", "list_files", "expose_port"]) {
    assert.ok(names.includes(want), `tools ${names} lack ${want}`);
  }
  const sb = json(await mcp.callTool({ name: "create_sandbox", arguments: {} }));
  assert.equal(sb.state, "running");

  const ex = json(await mcp.callTool({ name: "exec", arguments: { sandbox: sb.id, command: "echo hello from mcp" } }));
  assert.deepEqual([ex.stdout, ex.exit_code], ["hello from mcp\n", 0]);

  const rc = await mcp.callTool({ name: "run_code", arguments: {
    sandbox: sb.id, code: "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()\n" } });
  assert.ok(!rc.isError, rc.content[0].text);
  const images = rc.content.filter((c) => c.type === "image");
  assert.equal(images.length, 1, JSON.stringify(rc.content.map((c) => c.type)));
  assert.equal(images[0].mimeType, "image/png");
  assert.deepEqual([...Buffer.from(images[0].data, "base64").subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);

  await mcp.callTool({ name: "write_file", arguments: { sandbox: sb.id, path: "/tmp/m/f.txt", content: "via mcp" } });
  const read = await mcp.callTool({ name: "read_file", arguments: { sandbox: sb.id, path: "/tmp/m/f.txt" } });
  assert.equal(read.content[0].text, "via mcp");
  const ls = json(await mcp.callTool({ name: "list_files", arguments: { sandbox: sb.id, path: "/tmp/m" } }));
  assert.deepEqual(ls.entries.map((e) => e.type), ["file"]);

  // expose_port: a server started in the box answers at the URL it gives.
  const box = await Sandbox.fromId(sb.id, { client });
  await box.files.write("/tmp/www/index.html", "served to mcp");
  const server = await box.processes.start(["python3", "-m", "http.server", "8124", "--bind", "127.0.0.1", "--directory", "/tmp/www"]);
  const deadline = Date.now() + 20_000;
  while (!(await box.ports()).some((p) => p.port === 8124)) {
    assert.ok(Date.now() < deadline, "the server never listened on 8124");
    await new Promise((r) => setTimeout(r, 100));
  }
  const port = json(await mcp.callTool({ name: "expose_port", arguments: { sandbox: sb.id, port: 8124 } }));
  assert.equal(port.port, 8124);
  const res = await fetch(port.url, { headers: { Authorization: `Bearer ${d.token}` } });
  assert.equal(await res.text(), "served to mcp");
  await server.remove();
  const badPort = await mcp.callTool({ name: "expose_port", arguments: { sandbox: sb.id, port: 70000 } });
  assert.ok(badPort.isError && /port/.test(badPort.content[0].text), JSON.stringify(badPort));

  const list = json(await mcp.callTool({ name: "list_sandboxes", arguments: {} }));
  assert.ok(list.sandboxes.some((s) => s.id === sb.id));
  const destroyed = await mcp.callTool({ name: "destroy_sandbox", arguments: { sandbox: sb.id } });
  assert.ok(!destroyed.isError, destroyed.content[0].text);
  await assert.rejects(Sandbox.fromId(sb.id, { client }));
}

describe("mcp", () => {
  it("destroys what a stdio session created when its client goes away", async (t) => {
    if (d.skip) return t.skip(d.skip);
    const mcp = new McpClient({ name: "sbx-ts-test", version: "1" });
    await mcp.connect(new StdioClientTransport({
      command: SBX_BIN, args: ["--addr", d.addr, "mcp"], env: { ...process.env, SBX_TOKEN: d.token }, stderr: "ignore",
    }));
    const kept = await Sandbox.create({ client, labels: { "sbx-mcp": "1" } });
    const sb = json(await mcp.callTool({ name: "create_sandbox", arguments: {} }));
    await mcp.close();
    const deadline = Date.now() + 30_000;
    for (;;) {
      try {
        await Sandbox.fromId(sb.id, { client });
      } catch (e) {
        assert.equal(e.code, "not_found");
        break;
      }
      assert.ok(Date.now() < deadline, `the session's sandbox ${sb.id} outlived it`);
      await new Promise((r) => setTimeout(r, 100));
    }
    // Only its own: a sandbox it did not create is still there.
    assert.equal((await Sandbox.fromId(kept.id, { client })).state, "running");
    await kept.terminate();
  });

  it("serves the tools over stdio (sbx mcp)", async (t) => {
    if (d.skip) return t.skip(d.skip);
    const mcp = new McpClient({ name: "sbx-ts-test", version: "1" });
    await mcp.connect(new StdioClientTransport({
      command: SBX_BIN, args: ["--addr", d.addr, "mcp"], env: { ...process.env, SBX_TOKEN: d.token }, stderr: "ignore",
    }));
    try {
      await session(mcp);
    } finally {
      await mcp.close();
    }
  });

  it("serves the tools over streamable HTTP (/mcp) with the daemon's token", async (t) => {
    if (d.skip) return t.skip(d.skip);
    const url = new URL(`http://${d.addr}/mcp`);
    const mcp = new McpClient({ name: "sbx-ts-test", version: "1" });
    await mcp.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers: { Authorization: `Bearer ${d.token}` } } }));
    try {
      await session(mcp);
    } finally {
      await mcp.close();
    }
    const anon = new McpClient({ name: "sbx-ts-test", version: "1" });
    await assert.rejects(anon.connect(new StreamableHTTPClientTransport(url)), /401|nauthorized|token/);
  });
});

// One tenant's MCP session, over either transport, is an attacker against
// another tenant's sandbox: it must neither see it nor act on it, and the
// victim's box must come out untouched.
describe("mcp tenancy", () => {
  let td;
  let acme;
  before(async () => {
    if (d.skip) return;
    td = await startDaemon({ tenants: ["acme", "beta"] });
    acme = new Client({ addr: td.addr, token: td.tokens.acme });
  });
  after(async () => {
    if (td) {
      await td.stop(async () => {
        for (const s of await Sandbox.list({ client: acme })) await s.terminate().catch(() => undefined);
      });
    }
  });

  async function attack(mcp, victim) {
    const list = json(await mcp.callTool({ name: "list_sandboxes", arguments: {} }));
    assert.ok(!list.sandboxes.some((s) => s.id === victim.id), "the attacker lists the victim's sandbox");
    const tries = [
      ["exec", { sandbox: victim.id, command: "echo pwned > /tmp/secret" }],
      ["run_code", { sandbox: victim.id, code: "open('/tmp/secret', 'w').write('pwned')" }],
      ["read_file", { sandbox: victim.id, path: "/tmp/secret" }],
      ["write_file", { sandbox: victim.id, path: "/tmp/secret", content: "pwned" }],
      ["list_files", { sandbox: victim.id, path: "/tmp" }],
      ["expose_port", { sandbox: victim.id, port: 8000 }],
      ["destroy_sandbox", { sandbox: victim.id }],
      // By name too.
      ["exec", { sandbox: victim.name, command: "true" }],
    ];
    for (const [name, args] of tries) {
      const r = await mcp.callTool({ name, arguments: args });
      assert.ok(r.isError, `${name} on the victim's sandbox succeeded: ${JSON.stringify(r.content)}`);
      assert.match(r.content[0].text, /not.found|no such/i, `${name}: ${r.content[0].text}`);
      assert.doesNotMatch(r.content[0].text, /acme-secret/, `${name} leaked the victim's data`);
    }
  }

  async function untouched(victim) {
    const box = await Sandbox.fromId(victim.id, { client: acme });
    assert.equal(box.state, "running");
    assert.equal(await box.files.readText("/tmp/secret"), "acme-secret");
  }

  it("keeps one tenant's stdio session away from another tenant's sandboxes", async (t) => {
    if (d.skip) return t.skip(d.skip);
    const victim = await Sandbox.create({ client: acme, name: "acme-victim-stdio" });
    await victim.files.write("/tmp/secret", "acme-secret");
    const mcp = new McpClient({ name: "sbx-ts-attacker", version: "1" });
    await mcp.connect(new StdioClientTransport({
      command: SBX_BIN, args: ["--addr", td.addr, "mcp"], env: { ...process.env, SBX_TOKEN: td.tokens.beta }, stderr: "ignore",
    }));
    try {
      await attack(mcp, victim);
    } finally {
      await mcp.close();
    }
    await untouched(victim);
  });

  it("keeps one tenant's HTTP session away from another tenant's sandboxes", async (t) => {
    if (d.skip) return t.skip(d.skip);
    const victim = await Sandbox.create({ client: acme, name: "acme-victim-http" });
    await victim.files.write("/tmp/secret", "acme-secret");
    const mcp = new McpClient({ name: "sbx-ts-attacker", version: "1" });
    await mcp.connect(new StreamableHTTPClientTransport(new URL(`http://${td.addr}/mcp`),
      { requestInit: { headers: { Authorization: `Bearer ${td.tokens.beta}` } } }));
    try {
      await attack(mcp, victim);
      // Its own sandboxes are its tenant's: the victim's tenant does not see them.
      const own = json(await mcp.callTool({ name: "create_sandbox", arguments: {} }));
      await assert.rejects(Sandbox.fromId(own.id, { client: acme }), (e) => e.code === "not_found");
      assert.ok(!(await mcp.callTool({ name: "destroy_sandbox", arguments: { sandbox: own.id } })).isError);
    } finally {
      await mcp.close();
    }
    await untouched(victim);
  });
});
