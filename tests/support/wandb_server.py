"""A stand-in W&B backend on 127.0.0.1 for tests/wandb.rs.

Usage: wandb_server.py LOG [ok|hang]. Prints the port it listens on as the first
line of stdout, then appends every request to LOG as one JSON object per line:
{method, path, auth (the decoded Basic credentials), body (parsed JSON, or null)}.

ok:   answers what `wandb sync` and ptrain's online mode ask for: GraphQL
      UpsertBucket (a bucket) and CreateRunFiles (upload URLs back to this server),
      file_stream POSTs with {}, upload PUTs with 200, anything else with {"data": {}}.
hang: logs each request and never answers it, like a network that went dead.
flaky: like ok, but every other API request (the 1st, 3rd, ...) gets a 503 first,
      logged with "status": 503 and otherwise ignored.
"""

import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = open(sys.argv[1], "a", encoding="utf-8")
MODE = sys.argv[2] if len(sys.argv) > 2 else "ok"
LOCK = threading.Lock()
FOREVER = threading.Event()
API_CALLS = [0]


def record(handler, body, status):
    auth = handler.headers.get("Authorization") or ""
    decoded = None
    if auth.startswith("Basic "):
        decoded = base64.b64decode(auth[6:]).decode("utf-8", "replace")
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    entry = {"method": handler.command, "path": handler.path, "auth": decoded, "body": parsed, "status": status}
    with LOCK:
        LOG.write(json.dumps(entry) + "\n")
        LOG.flush()
    return parsed


def graphql(handler, request):
    query = (request or {}).get("query", "")
    variables = (request or {}).get("variables") or {}
    if "upsertBucket" in query:
        project = variables.get("project") or "uncategorized"
        entity = variables.get("entity") or "test-entity"
        return {
            "data": {
                "upsertBucket": {
                    "bucket": {
                        "id": "UnVuOnYx",
                        "name": variables.get("name") or "run",
                        "displayName": variables.get("displayName"),
                        "description": None,
                        "config": "{}",
                        "sweepName": None,
                        "historyLineCount": 0,
                        "project": {"id": "UHJvamVjdDp2MQ==", "name": project, "entity": {"id": "RW50aXR5OnYx", "name": entity}},
                    },
                    "inserted": True,
                }
            }
        }
    if "createRunFiles" in query:
        port = handler.server.server_address[1]
        files = [{"name": f, "uploadUrl": f"http://127.0.0.1:{port}/upload/{f}"} for f in variables.get("files", [])]
        return {"data": {"createRunFiles": {"runID": "UnVuOnYx", "uploadHeaders": [], "files": files}}}
    return {"data": {}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self, payload):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self):
        status = 200
        if MODE == "flaky" and (self.path.startswith("/graphql") or self.path.startswith("/files/")):
            with LOCK:
                API_CALLS[0] += 1
                if API_CALLS[0] % 2 == 1:
                    status = 503
        request = record(self, self.body(), status)
        if status != 200:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if MODE == "hang":
            FOREVER.wait()
            return
        if self.command == "POST" and self.path.startswith("/graphql"):
            self.answer(graphql(self, request))
        else:
            self.answer({})

    do_GET = do_POST = do_PUT = handle_any

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True


def main():
    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
