// The terminal: xterm.js over the daemon's WebSocket PTY exec
// (internal/server execws.go). The token goes in the first message, never
// in the URL.
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";
import { token } from "./api";

export function openTerminal(el: HTMLElement, sandbox: string): () => void {
  const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 13, scrollback: 2000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(el);
  try {
    fit.fit();
  } catch {
    /* not laid out yet */
  }
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ui/exec`);
  ws.binaryType = "arraybuffer";
  const enc = new TextEncoder();
  ws.addEventListener("open", () => {
    ws.send(JSON.stringify({ token: token(), sandbox, cols: term.cols, rows: term.rows }));
    el.dataset.state = "open";
  });
  ws.addEventListener("message", (ev) => {
    if (ev.data instanceof ArrayBuffer) {
      term.write(new Uint8Array(ev.data));
      return;
    }
    const msg = JSON.parse(String(ev.data)) as { exited?: { exitCode: number }; error?: string };
    if (msg.exited) term.write(`\r\n[exited ${msg.exited.exitCode}]\r\n`);
    if (msg.error) term.write(`\r\n[error: ${msg.error}]\r\n`);
  });
  ws.addEventListener("close", (ev) => {
    el.dataset.state = "closed";
    if (ev.code !== 1000) term.write(`\r\n[disconnected: ${ev.code} ${ev.reason}]\r\n`);
  });
  const data = term.onData((d) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d));
  });
  const resize = term.onResize(({ cols, rows }) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ resize: { cols, rows } }));
  });
  const onWin = () => {
    try {
      fit.fit();
    } catch {
      /* hidden */
    }
  };
  window.addEventListener("resize", onWin);
  return () => {
    window.removeEventListener("resize", onWin);
    data.dispose();
    resize.dispose();
    ws.close();
    term.dispose();
  };
}
