"""A stand-in W&B backend on 127.0.0.1 for tests/wandb.rs.

Usage: wandb_server.py LOG [ok|hang]. Prints the port it listens on as the first
line of stdout, then appends every request to LOG as one JSON object per line:
{method, path, auth (the decoded Basic credentials), body (parsed JSON, or null)}.

ok:   answers what `wandb sync` and ptrain's online mode ask for: GraphQL
      UpsertBucket (a bucket), CreateRunFiles (upload URLs back to this server) and
      RunResumeStatus (the history lines file_stream has received for the run, so a
      resumed run appends after them), file_stream POSTs with {}, upload PUTs with
      200, anything else with {"data": {}}.
hang: logs each request and never answers it, like a network that went dead.
refuse-uploads: like ok, but every upload PUT gets a 403 (logged with "status": 403),
      as a storage bucket refusing a bad or expired signed URL does.
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
# (entity, project, run id) -> what a W&B backend keeps of a run: the config of
# its last UpsertBucket, and the history lines and summary file_stream sent.
RUNS = {}


def run_state(entity, project, name):
    return RUNS.setdefault((entity or "test-entity", project or "uncategorized", name), {"config": {}, "history": [], "summary": "{}"})


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
        if variables.get("config"):
            with LOCK:
                run_state(entity, project, variables.get("name"))["config"] = json.loads(variables["config"])
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
    if "RunResumeStatus" in query:
        entity, project = variables.get("entity") or "test-entity", variables.get("project") or "uncategorized"
        with LOCK:
            run = RUNS.get((entity, project, variables.get("name")))
            run = json.loads(json.dumps(run)) if run else None
        model = {"id": "UHJvamVjdDp2MQ==", "name": project, "entity": {"id": "RW50aXR5OnYx", "name": entity}, "bucket": None}
        if run:
            # Like W&B: `wandbConfig` holds the `t` (telemetry) of the run's `_wandb`
            # config, which clients take as the sign that the run has started.
            telemetry = (run["config"].get("_wandb") or {}).get("value", {}).get("t")
            model["bucket"] = {
                "id": "UnVuOnYx",
                "name": variables.get("name"),
                "displayName": variables.get("name"),
                "summaryMetrics": run["summary"],
                "logLineCount": 0,
                "historyLineCount": len(run["history"]),
                "eventsLineCount": 0,
                "historyTail": json.dumps(run["history"][-10:]),
                "eventsTail": "[]",
                "config": json.dumps(run["config"]),
                "tags": [],
                "notes": None,
                "wandbConfig": json.dumps({"t": telemetry} if telemetry is not None else {}),
            }
        return {"data": {"model": model}}
    if "createRunFiles" in query:
        port = handler.server.server_address[1]
        files = [{"name": f, "uploadUrl": f"http://127.0.0.1:{port}/upload/{f}"} for f in variables.get("files", [])]
        return {"data": {"createRunFiles": {"runID": "UnVuOnYx", "uploadHeaders": [], "files": files}}}
    return {"data": {}}


def keep_history(path, request):
    _, _, entity, project, name, _ = path.split("/")
    files = (request or {}).get("files") or {}
    with LOCK:
        run = run_state(entity, project, name)
        if "wandb-history.jsonl" in files:
            history = files["wandb-history.jsonl"]
            del run["history"][history["offset"]:]
            run["history"].extend(history["content"])
        if "wandb-summary.json" in files:
            run["summary"] = files["wandb-summary.json"]["content"][-1]


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
        if MODE == "refuse-uploads" and self.command == "PUT":
            status = 403
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
        elif self.command == "POST" and self.path.endswith("/file_stream"):
            keep_history(self.path, request)
            self.answer({})
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
