"""A server of the Hugging Face Hub's HTTP API for one dataset repository, on the loopback, for
the tests of ``hf://`` (huggingface_hub's file system, pointed at it with ``endpoint``). It
serves a local folder as the repository ``REPO`` at the revision ``main`` (commit ``SHA``), with
the routes that file system reads a repository through:

* ``GET /api/datasets/REPO[/revision/main]``: the repository's info (its commit, its files);
* ``GET /api/datasets/REPO/tree/main[/PATH]``: a folder's entries (``?recursive=true``: all
  under it), each file with its size, git blob id and LFS object (SHA-256), as the Hub lists
  them;
* ``POST /api/datasets/REPO/paths-info/main``: the entries of the paths named in the form;
* ``GET|HEAD /datasets/REPO/resolve/main/PATH``: a file's bytes, with range requests, its ETag
  and ``X-Repo-Commit``.

Run as ``python -m tests.helpers.hub PORT FOLDER``; :class:`HubServer` starts one in a process of
its own (a :class:`~tests.helpers.remote._ServerProcess`). Every request is counted by
``METHOD path`` (``GET /__requests__`` answers the counts as JSON).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

REPO = "fastpipe-tests/photos"
SHA = "0123456789abcdef0123456789abcdef01234567"
COUNTS = "/__requests__"


def _entry(root: Path, path: Path) -> dict:
    rel = path.relative_to(root).as_posix()
    if path.is_dir():
        return {"type": "directory", "path": rel,
                "oid": hashlib.sha1(rel.encode()).hexdigest()}
    data = path.read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return {"type": "file", "path": rel, "size": len(data), "oid": blob,
            "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                    "pointerSize": 134}}


def _handler(root: Path, counts: Counter, lock: threading.Lock) -> type:
    api = f"/api/datasets/{REPO}"

    class Hub(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, value: object, status: int = 200) -> None:
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Repo-Commit", SHA)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _missing(self) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _file(self, path: Path) -> None:
            data = path.read_bytes()
            entry = _entry(root, path)
            start, end, status = 0, len(data), 200
            asked = self.headers.get("Range")
            if asked and asked.startswith("bytes="):
                first, _, last = asked[6:].partition("-")
                start = int(first) if first else max(0, len(data) - int(last))
                end = min(len(data), int(last) + 1) if first and last else len(data)
                status = 206
            self.send_response(status)
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{entry["lfs"]["oid"]}"')
            self.send_header("X-Repo-Commit", SHA)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data[start:end])

        def _route(self) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            with lock:
                counts[f"{self.command} {path}"] += 1
            if path == COUNTS:
                with lock:
                    return self._json(dict(counts))
            if path in (api, f"{api}/revision/main"):
                files = sorted(p for p in root.rglob("*") if p.is_file())
                return self._json({"id": REPO, "sha": SHA, "private": False, "disabled": False,
                                   "siblings": [{"rfilename": p.relative_to(root).as_posix()}
                                                for p in files]})
            if path.startswith(f"{api}/tree/main"):
                folder = root / path[len(f"{api}/tree/main"):].strip("/")
                if not folder.is_dir():
                    return self._missing()
                recursive = parse_qs(url.query).get("recursive") == ["true"]
                found = sorted(folder.rglob("*") if recursive else folder.iterdir())
                return self._json([_entry(root, p) for p in found])
            if path == f"{api}/paths-info/main":
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                named = [root / p for p in form.get("paths", [])]
                return self._json([_entry(root, p) for p in named if p.exists()])
            prefix = f"/datasets/{REPO}/resolve/main/"
            if path.startswith(prefix) and (root / path[len(prefix):]).is_file():
                return self._file(root / path[len(prefix):])
            return self._missing()

        do_GET = do_HEAD = do_POST = _route

    return Hub


def serve(port: int, root: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(root, Counter(),
                                                              threading.Lock()))
    server.daemon_threads = True
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    serve(int(sys.argv[1]), Path(sys.argv[2]).resolve())
