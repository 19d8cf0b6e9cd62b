"""A loopback stand-in for the Hugging Face Hub's upload API, for tests (no network needed).

It speaks just what ``huggingface_hub`` (2.x) sends for ``create_repo``, ``create_branch``,
``create_commit`` / ``upload_folder`` and ``push_to_hub`` of small files:

- ``POST /api/repos/create``                        -> ``{"url": ...}`` (409 if it exists)
- ``POST /api/models/{repo}/branch/{branch}``       -> create a branch (409 if it exists)
- ``POST /api/validate-yaml``                       -> README.md front-matter must parse as YAML
- ``POST /api/models/{repo}/preupload/{revision}``  -> every file is "regular" (inline base64 in
  the commit), so no LFS / Xet transfer is ever negotiated
- ``POST /api/models/{repo}/commit/{revision}``     -> NDJSON header + ``file`` ops, stored in memory

and what ``hf_hub_download`` asks for to read a file back:

- ``HEAD|GET /{repo}/resolve/{revision}/{path}``      -> the file's bytes, with the commit and ETag headers

Anything else is recorded in ``server.unexpected`` and answered 501 with a message naming it,
so a test can assert that the client asked for nothing this server does not understand.

    with HubServer() as hub:
        ...  # point huggingface_hub at hub.url (HF_ENDPOINT or HfApi(endpoint=...))
        hub.files("user/repo")  # {"config.json": b"...", ...}
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import yaml

DEFAULT_USER = "test-user"


@dataclass
class Commit:
    repo_id: str
    revision: str
    oid: str
    summary: str
    description: str
    paths: list[str]


@dataclass
class FileResponse:
    """A file's bytes and the headers ``hf_hub_download`` reads (commit id, ETag)."""

    data: bytes
    headers: dict[str, str]


@dataclass
class Repo:
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    commits: list[Commit] = field(default_factory=list)


class HubServer:
    """A threaded HTTP server on 127.0.0.1 (free port) holding repos in memory."""

    def __init__(self, user: str = DEFAULT_USER):
        self.user = user
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self.unexpected: list[str] = []
        self.authorizations: set[str] = set()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        return dict(self.repos[repo_id].branches[revision])

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # -- API ---------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers, body: bytes) -> tuple[int, dict | FileResponse]:
        with self._lock:
            self.requests.append((method, path))
            if "authorization" in headers:
                self.authorizations.add(headers["authorization"])
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if method == "POST" and parts == ["api", "repos", "create"]:
                return self._create_repo(json.loads(body))
            if method == "POST" and parts == ["api", "validate-yaml"]:
                return self._validate_yaml(json.loads(body))
            if method in ("GET", "HEAD") and len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
            if method == "POST" and len(parts) == 6 and parts[:2] == ["api", "models"]:
                repo_id, action, revision = f"{parts[2]}/{parts[3]}", parts[4], parts[5]
                if repo_id not in self.repos:
                    return 404, {"error": f"Repository {repo_id} not found"}
                if action == "branch":
                    return self._create_branch(repo_id, revision)
                if revision not in self.repos[repo_id].branches:
                    return 404, {"error": f"Invalid rev id: {revision}"}
                if action == "preupload":
                    return self._preupload(json.loads(body))
                if action == "commit":
                    return self._commit(repo_id, revision, body)
            message = f"hub_server does not implement {method} {path}"
            self.unexpected.append(message)
            return 501, {"error": message}

    def _resolve(self, repo_id: str, revision: str, file_path: str) -> tuple[int, dict | FileResponse]:
        if repo_id not in self.repos:
            return 404, {"error": f"Repository {repo_id} not found"}
        repo = self.repos[repo_id]
        if revision not in repo.branches:
            return 404, {"error": f"Invalid rev id: {revision}"}
        if file_path not in repo.branches[revision]:
            return 404, {"error": f"Entry not found: {file_path}"}
        data = repo.branches[revision][file_path]
        head = next((c.oid for c in reversed(repo.commits) if c.revision == revision), "0" * 40)
        return 200, FileResponse(data, {"X-Repo-Commit": head, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'})

    def _create_repo(self, payload: dict) -> tuple[int, dict]:
        if payload.get("type", "model") != "model":
            return 400, {"error": f"hub_server only holds model repos, got type {payload.get('type')!r}"}
        repo_id = f"{payload.get('organization') or self.user}/{payload['name']}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
        self.repos[repo_id] = Repo(private=payload.get("visibility") == "private")
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id, "id": repo_id}

    def _create_branch(self, repo_id: str, branch: str) -> tuple[int, dict]:
        branches = self.repos[repo_id].branches
        if branch in branches:
            return 409, {"error": f"Reference already exists: {branch}"}
        branches[branch] = dict(branches["main"])
        return 200, {}

    def _validate_yaml(self, payload: dict) -> tuple[int, dict]:
        content = payload.get("content", "")
        if content.startswith("---\n"):
            front, sep, _ = content[4:].partition("\n---")
            try:
                if not sep or not isinstance(yaml.safe_load(front) or {}, dict):
                    raise yaml.YAMLError("front matter is not a mapping closed by ---")
            except yaml.YAMLError as error:
                return 400, {"errors": [{"message": f"invalid YAML metadata: {error}"}]}
        return 200, {"errors": [], "warnings": []}

    def _preupload(self, payload: dict) -> tuple[int, dict]:
        files = [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in payload["files"]
        ]
        return 200, {"files": files, "commitOid": "0" * 40}

    def _commit(self, repo_id: str, revision: str, body: bytes) -> tuple[int, dict]:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            return 400, {"error": "commit payload must start with a header line"}
        header = lines[0]["value"]
        staged = dict(self.repos[repo_id].branches[revision])
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value", {})
            if key == "file" and value.get("encoding") == "base64":
                staged[value["path"]] = base64.b64decode(value["content"], validate=True)
            elif key == "deletedFile":
                staged.pop(value["path"], None)
            else:  # lfsFile would need an LFS transfer this server never offers
                self.unexpected.append(f"commit operation {key!r} for {value.get('path')!r}")
                return 400, {"error": f"hub_server does not accept commit operation {key!r}"}
        self.repos[repo_id].branches[revision] = staged
        oid = hashlib.sha1(body).hexdigest()
        paths = [line["value"]["path"] for line in lines[1:]]
        self.repos[repo_id].commits.append(
            Commit(repo_id, revision, oid, header.get("summary", ""), header.get("description", ""), paths)
        )
        return 200, {"commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}


def _error_code(message: str) -> str:
    """The ``X-Error-Code`` the Hub sends with a 404, which huggingface_hub turns into its exception types."""
    if message.startswith("Repository"):
        return "RepoNotFound"
    return "EntryNotFound" if message.startswith("Entry") else "RevisionNotFound"


def _make_handler(server: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            body = self._read_body()
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, payload = server.handle(self.command, urlsplit(self.path).path, headers, body)
            if isinstance(payload, FileResponse):
                data, extra = payload.data, {"Content-Type": "application/octet-stream", **payload.headers}
            else:
                data, extra = json.dumps(payload).encode(), {"Content-Type": "application/json"}
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            if status == 404:
                self.send_header("X-Error-Code", _error_code(payload.get("error", "")))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    chunk = self.rfile.read(size)
                    self.rfile.readline()
                    if size == 0:
                        return b"".join(chunks)
                    chunks.append(chunk)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

    return Handler
