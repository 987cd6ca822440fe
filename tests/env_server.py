"""An environment server process for the tests: `python tests/env_server.py PORT`. POST /add {"a", "b"} answers
{"sum": a + b}; an addend of -666 hangs the call (60 s), one of -999 kills the server (os._exit) mid-call (no
task draws negative numbers). `tests/env_tools.py:add` is the tool that calls it."""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        a, b = int(body["a"]), int(body["b"])
        if -999 in (a, b):
            os._exit(3)
        if -666 in (a, b):
            time.sleep(60)
        payload = json.dumps({"sum": a + b}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("ready", flush=True)
    server.serve_forever()
