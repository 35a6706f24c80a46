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

  const list = json(await mcp.callTool({ name: "list_sandboxes", arguments: {} }));
  assert.ok(list.sandboxes.some((s) => s.id === sb.id));
  const destroyed = await mcp.callTool({ name: "destroy_sandbox", arguments: { sandbox: sb.id } });
  assert.ok(!destroyed.isError, destroyed.content[0].text);
  await assert.rejects(Sandbox.fromId(sb.id, { client }));
}

describe("mcp", () => {
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
