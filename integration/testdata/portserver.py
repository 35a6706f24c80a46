"""A test server for the port proxy tests, standard library only.

HTTP on 127.0.0.1:$PORT_HTTP (default 8000; loopback only: the proxy must reach it through the
agent): GET echoes the path and headers as JSON; /stream sends one chunk,
waits for /tmp/go to exist, then sends the rest; /ws is a WebSocket echo;
POST answers the body's length and sha256. Raw TCP on 127.0.0.1:$PORT_TCP (default 9000):
reads until EOF, answers the data upper-cased, closes.
"""
import base64
import hashlib
import http.server
import json
import os
import socket
import socketserver
import struct
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16  # one write per response (no Nagle stalls); flushed after each request

    def log_message(self, *args):
        pass

    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(data):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            chunk(b"first\n")
            while not os.path.exists("/tmp/go"):
                time.sleep(0.02)
            chunk(b"second\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        if self.path.startswith("/ws"):
            return self._websocket()
        self._json({"path": self.path, "headers": [[k, v] for k, v in self.headers.items()]})

    def do_POST(self):
        left = int(self.headers.get("Content-Length", "0"))
        h, n = hashlib.sha256(), 0
        while left:
            b = self.rfile.read(min(left, 1 << 16))
            if not b:
                break
            h.update(b)
            n += len(b)
            left -= len(b)
        self._json({"len": n, "sha256": h.hexdigest()})

    def _websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            hdr = self.rfile.read(2)
            if len(hdr) < 2:
                return
            op, n = hdr[0] & 0x0F, hdr[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if hdr[1] & 0x80 else b"\0\0\0\0"
            raw = self.rfile.read(n)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(raw))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            out = b"echo:" + data
            if len(out) < 126:
                head = bytes([0x80 | op, len(out)])
            elif len(out) < 65536:
                head = bytes([0x80 | op, 126]) + struct.pack(">H", len(out))
            else:
                head = bytes([0x80 | op, 127]) + struct.pack(">Q", len(out))
            self.wfile.write(head + out)
            self.wfile.flush()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def tcp_echo():
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", int(os.environ.get("PORT_TCP", "9000"))))
    ls.listen(16)
    while True:
        c, _ = ls.accept()

        def serve(c):
            data = b""
            while True:
                b = c.recv(65536)
                if not b:
                    break
                data += b
            c.sendall(data.upper())
            c.close()

        threading.Thread(target=serve, args=(c,), daemon=True).start()


threading.Thread(target=tcp_echo, daemon=True).start()
Server(("127.0.0.1", int(os.environ.get("PORT_HTTP", "8000"))), Handler).serve_forever()
