"""A stand-in Hugging Face hub on 127.0.0.1: a test double (no hub can be reached from these machines), serving real
GGUF files from disk through the two routes huggingface_hub's model_info and file URLs use — the revision's info
with its files' sizes (`/api/models/REPO/revision/REV?blobs=true`) and `/REPO/resolve/COMMIT/FILE` with HTTP
ranges — and logging every request with the bytes it sent, so a test can see what was fetched."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class Hub:
    """repos: {repo id: (commit, {file name in the repo: local path})}; revisions: {(repo, name): commit}."""

    def __init__(self, repos: dict[str, tuple[str, dict[str, Path]]], ranges: bool = True):
        """ranges=False: a server that ignores Range headers (sends whole files, 200)."""
        self.repos = repos
        self.ranges = ranges
        self.log: list[dict] = []
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", headers=None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                with hub.lock:
                    hub.log.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "range": self.headers.get("Range"),
                            "status": code,
                            "sent": len(body) if self.command != "HEAD" else 0,
                        }
                    )

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                path = unquote(urlsplit(self.path).path)
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
                if m:
                    repo = hub.repos.get(m[1])
                    if repo is None:
                        return self._send(404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                    commit, files = repo
                    info = {
                        "id": m[1],
                        "sha": commit,
                        "siblings": [{"rfilename": n, "size": p.stat().st_size} for n, p in sorted(files.items())],
                    }
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([0-9a-f]{40})/(.+)", path)
                repo = hub.repos.get(m[1]) if m else None
                if not m or repo is None or repo[0] != m[2] or m[3] not in repo[1]:
                    return self._send(404, b"not found", {"X-Error-Code": "EntryNotFound"})
                data = repo[1][m[3]]
                size = data.stat().st_size
                rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if not rng or not hub.ranges:
                    return self._send(200, data.read_bytes())
                a, b = int(rng[1]), min(int(rng[2] or size - 1), size - 1)
                with open(data, "rb") as f:
                    f.seek(a)
                    body = f.read(b - a + 1)
                return self._send(206, body, {"Content-Range": f"bytes {a}-{b}/{size}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def sent(self, name: str) -> list[dict]:
        """The requests for one file (its resolve route)."""
        with self.lock:
            return [r for r in self.log if "/resolve/" in r["path"] and r["path"].endswith("/" + name)]
