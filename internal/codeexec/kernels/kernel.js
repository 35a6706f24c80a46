// sbx JavaScript kernel: one JSON request per stdin line ({"code", "out"}),
// runs it in a persistent vm context, then writes TOKEN + JSON reply on
// stdout and TOKEN on stderr. User output goes straight to fds 1 and 2.
'use strict';
const vm = require('vm');
const fs = require('fs');
const util = require('util');
const readline = require('readline');
const Module = require('module');

const TOKEN = process.env.SBX_KERNEL_TOKEN || '';
delete process.env.SBX_KERNEL_TOKEN;
const sandbox = {
  console, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
  queueMicrotask, structuredClone, fetch: globalThis.fetch, AbortController,
  __filename: '<cell>',
};
sandbox.global = sandbox;
sandbox.globalThis = sandbox;
const ctx = vm.createContext(sandbox);

function bundle(v) {
  const out = { text: util.inspect(v, { depth: 4 }) };
  if (v && typeof v === 'object' && typeof v._repr_html_ === 'function') {
    try { out.html = String(v._repr_html_()); } catch (e) { /* ignore */ }
  }
  return out;
}

async function run(code, out) {
  if (out) {
    fs.mkdirSync(out, { recursive: true });
    process.env.SBX_OUTPUT_DIR = out;
  }
  sandbox.require = Module.createRequire(process.cwd() + '/');
  try {
    let v = vm.runInContext(code, ctx, { filename: '<cell>', breakOnSigint: true });
    if (v && typeof v.then === 'function') v = await v;
    const reply = { ok: true };
    if (v !== undefined) reply.value = bundle(v);
    return reply;
  } catch (e) {
    const name = (e && e.name) || 'Error';
    const msg = (e && e.message) || String(e);
    process.stderr.write(((e && e.stack) || String(e)) + '\n');
    return { ok: false, error: name + ': ' + msg };
  }
}

const rl = readline.createInterface({ input: process.stdin, terminal: false });
const queue = [];
let busy = false;
async function pump() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    const req = JSON.parse(queue.shift());
    const reply = await run(req.code || '', req.out || '');
    reply.id = req.id || 0;
    fs.writeSync(1, TOKEN + JSON.stringify(reply) + '\n');
    fs.writeSync(2, TOKEN + String(reply.id) + '\n');
  }
  busy = false;
}
rl.on('line', (line) => { if (line.trim()) { queue.push(line); pump(); } });
rl.on('close', () => process.exit(0));
