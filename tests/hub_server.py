"""A small, real Hugging Face Hub server on 127.0.0.1, for tests: the part of the Hub HTTP API that the installed
`huggingface_hub` client uses to create a model repo, commit files to it and download them again.

Served (model repos, branch `main`, revisions by branch name or commit sha):

- `POST /api/repos/create`; `GET /api/models/{repo}` and `.../revision/{rev}` (repo info with its files);
  `GET /api/whoami-v2`; `POST /api/validate-yaml` (the README front matter must parse as YAML)
- `POST /api/models/{repo}/preupload/{rev}`: `lfs` for what the Hub stores in LFS (`*.safetensors`, `*.bin`, large
  files), `regular` otherwise
- `POST /{repo}.git/info/lfs/objects/batch`, then `PUT` the object and `POST` verify (the basic LFS transfer;
  clients must not use Xet here: set `HF_HUB_DISABLE_XET=1`)
- `POST /api/models/{repo}/commit/{rev}`: NDJSON header, `file` (base64) and `lfsFile` lines, and deletions
- `HEAD`/`GET /{repo}/resolve/{rev}/{path}` with `X-Repo-Commit`, `ETag` and `Content-Length`, and the error codes
  (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`) the client turns into its exceptions

Writes need `Authorization: Bearer <token>`; reads of a private repo too. Every request is logged in `requests`.

    with HubServer(token="hf_test") as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test", "HF_HUB_DISABLE_XET": "1"}
"""

import base64
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".onnx", ".msgpack", ".model", ".zip")
LFS_MIN_SIZE = 10 * 1024 * 1024
GITATTRIBUTES = "".join(f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n" for suffix in LFS_SUFFIXES).encode()
USER = "test-user"


def git_blob_sha1(content: bytes) -> str:
    """The id git gives a file's content: what the Hub sends as the ETag of a regular file."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class StoredFile:
    content: bytes
    lfs: bool

    @property
    def etag(self) -> str:
        return hashlib.sha256(self.content).hexdigest() if self.lfs else git_blob_sha1(self.content)


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: list[tuple[str, dict[str, StoredFile]]] = field(default_factory=list)  # oldest first

    def snapshot(self, revision: str) -> tuple[str, dict[str, StoredFile]] | None:
        """(commit sha, files) at a branch name (only `main`) or a commit sha; None if unknown."""
        if revision == "main":
            return self.commits[-1]
        return next((commit for commit in self.commits if commit[0] == revision), None)

    def commit(self, files: dict[str, StoredFile]) -> str:
        sha = hashlib.sha1(f"{self.repo_id}:{len(self.commits)}:{time.time_ns()}".encode()).hexdigest()
        self.commits.append((sha, files))
        return sha


class HubServer:
    """The server, run in a background thread; use as a context manager or call `start` and `stop`."""

    def __init__(self, token: str = "hf_test", host: str = "127.0.0.1") -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def _handler_for(hub: HubServer) -> type:
    class Handler(_HubHandler):
        pass

    Handler.hub = hub
    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: HubServer

    def log_message(self, format: str, *args: object) -> None:  # quiet: the log is `hub.requests`
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    ROUTES = (
        ("POST", r"/api/repos/create", "create_repo"),
        ("GET", r"/api/whoami-v2", "whoami"),
        ("POST", r"/api/validate-yaml", "validate_yaml"),
        ("POST", r"/api/models/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)", "preupload"),
        ("POST", r"/api/models/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)", "commit"),
        ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?", "repo_info"),
        ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<folder>.*))?", "tree"),
        ("POST", r"/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch", "lfs_batch"),
        ("PUT", r"/lfs/objects/(?P<oid>[0-9a-f]{64})", "lfs_upload"),
        ("POST", r"/lfs/verify", "lfs_verify"),
        ("GET", r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
        ("HEAD", r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
    )

    def _dispatch(self, method: str) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.hub.lock:
            self.hub.requests.append((method, path))
        body = self._read_body()
        try:
            for route_method, pattern, name in self.ROUTES:
                match = re.fullmatch(pattern, path)
                if route_method == method and match:
                    with self.hub.lock:
                        getattr(self, name)(body=body, head=method == "HEAD", **match.groupdict())
                    return
            raise HubError(404, f"no route for {method} {path}")
        except HubError as error:
            headers = {"X-Error-Message": error.message}
            if error.code:
                headers["X-Error-Code"] = error.code
            self._send(error.status, json.dumps({"error": error.message}).encode(), headers, head=method == "HEAD")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
                if size == 0:
                    return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if "Content-Type" not in (headers or {}):
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, payload: object, status: int = 200) -> None:
        self._send(status, json.dumps(payload).encode())

    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def _require_token(self) -> None:
        if not self._authorized():
            raise HubError(401, "Invalid credentials in Authorization header")

    def _repo(self, repo_id: str, write: bool = False) -> Repo:
        if write:
            self._require_token()
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            raise HubError(404, f"Repository Not Found for url: {repo_id}", "RepoNotFound")
        return repo

    def _snapshot(self, repo: Repo, rev: str) -> tuple[str, dict[str, StoredFile]]:
        snapshot = repo.snapshot(rev)
        if snapshot is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return snapshot

    # ---- the API -------------------------------------------------------------------------------------------

    def create_repo(self, body: bytes, **_: object) -> None:
        self._require_token()
        payload = json.loads(body)
        if payload.get("type", "model") != "model":
            raise HubError(400, "this test server only hosts model repos")
        repo_id = f"{payload.get('organization') or USER}/{payload['name']}"
        url = f"{self.hub.url}/{repo_id}"
        if repo_id in self.hub.repos:
            self._json({"error": "You already created this model repo", "url": url}, status=409)
            return
        repo = Repo(repo_id, private=payload.get("visibility") == "private")
        repo.commit({".gitattributes": StoredFile(GITATTRIBUTES, lfs=False)})
        self.hub.repos[repo_id] = repo
        self._json({"url": url, "name": repo_id})

    def whoami(self, **_: object) -> None:
        self._require_token()
        self._json({"type": "user", "name": USER, "orgs": [], "auth": {"type": "access_token"}})

    def validate_yaml(self, body: bytes, **_: object) -> None:
        import yaml

        content = json.loads(body)["content"]
        match = re.match(r"\A---\n(.*?)\n---\n", content, flags=re.DOTALL)
        try:
            if match is not None and not isinstance(yaml.safe_load(match.group(1)) or {}, dict):
                raise yaml.YAMLError("the front matter is not a mapping")
        except yaml.YAMLError as error:
            self._json({"errors": [{"message": str(error)}]}, status=400)
            return
        self._json({"errors": [], "warnings": []})

    def preupload(self, body: bytes, repo: str, rev: str, **_: object) -> None:
        stored = self._snapshot(self._repo(repo, write=True), rev)[1]
        files = []
        for entry in json.loads(body)["files"]:
            lfs = entry["path"].endswith(LFS_SUFFIXES) or entry["size"] >= LFS_MIN_SIZE
            old = stored.get(entry["path"])
            files.append(
                {
                    "path": entry["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": False,
                    "oid": old.etag if old is not None else None,
                }
            )
        self._json({"files": files})

    def lfs_batch(self, body: bytes, repo: str, **_: object) -> None:
        self._repo(repo, write=True)
        payload = json.loads(body)
        objects = []
        for item in payload["objects"]:
            entry = {"oid": item["oid"], "size": item["size"]}
            if item["oid"] not in self.hub.lfs_objects:
                entry["actions"] = {
                    "upload": {"href": f"{self.hub.url}/lfs/objects/{item['oid']}"},
                    "verify": {"href": f"{self.hub.url}/lfs/verify"},
                }
            objects.append(entry)
        self._json({"transfer": "basic", "objects": objects})

    def lfs_upload(self, body: bytes, oid: str, **_: object) -> None:
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, f"the uploaded content does not hash to {oid}")
        self.hub.lfs_objects[oid] = body
        self._send(200, b"")

    def lfs_verify(self, body: bytes, **_: object) -> None:
        self._require_token()
        payload = json.loads(body)
        stored = self.hub.lfs_objects.get(payload["oid"])
        if stored is None or len(stored) != payload["size"]:
            raise HubError(404, f"LFS object {payload['oid']} was not uploaded")
        self._json({"success": True})

    def commit(self, body: bytes, repo: str, rev: str, **_: object) -> None:
        target = self._repo(repo, write=True)
        if rev != "main":
            raise HubError(400, "this test server commits to the main branch only")
        files = dict(self._snapshot(target, rev)[1])
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header" or not lines[0]["value"].get("summary"):
            raise HubError(400, "a commit starts with a header line that has a summary")
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                files[value["path"]] = StoredFile(base64.b64decode(value["content"]), lfs=False)
            elif line["key"] == "lfsFile":
                content = self.hub.lfs_objects.get(value["oid"])
                if content is None:
                    raise HubError(422, f"LFS object {value['oid']} for {value['path']} was never uploaded")
                files[value["path"]] = StoredFile(content, lfs=True)
            elif line["key"] == "deletedFile":
                files.pop(value["path"], None)
            elif line["key"] == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                files = {path: f for path, f in files.items() if not path.startswith(prefix)}
            else:
                raise HubError(400, f"unknown commit operation {line['key']!r}")
        sha = target.commit(files)
        self._json({"commitUrl": f"{self.hub.url}/{repo}/commit/{sha}", "commitOid": sha, "pullRequestUrl": None})

    def repo_info(self, repo: str, rev: str | None = None, **_: object) -> None:
        sha, files = self._snapshot(self._repo(repo), rev or "main")
        self._json(
            {
                "id": repo,
                "modelId": repo,
                "sha": sha,
                "private": self.hub.repos[repo].private,
                "siblings": [{"rfilename": path} for path in sorted(files)],
                "tags": [],
                "downloads": 0,
                "likes": 0,
            }
        )

    def tree(self, repo: str, rev: str, folder: str | None = None, **_: object) -> None:
        """The files and folders directly under `folder` (the root by default), as `list_repo_tree` reads them."""
        files = self._snapshot(self._repo(repo), rev)[1]
        prefix = f"{folder.strip('/')}/" if folder and folder.strip("/") else ""
        entries: dict[str, dict] = {}
        for path, stored in sorted(files.items()):
            if not path.startswith(prefix):
                continue
            head, _, rest = path[len(prefix) :].partition("/")
            if rest:
                entries.setdefault(head, {"type": "directory", "path": prefix + head, "oid": "0" * 40, "size": 0})
                continue
            entry = {"type": "file", "path": path, "size": len(stored.content), "oid": git_blob_sha1(stored.content)}
            if stored.lfs:
                entry["lfs"] = {"oid": stored.etag, "size": len(stored.content), "pointerSize": 134}
            entries[head] = entry
        if prefix and not entries:
            raise HubError(404, f"Entry not found: {folder}", "EntryNotFound")
        self._json(list(entries.values()))

    def resolve(self, repo: str, rev: str, path: str, head: bool, **_: object) -> None:
        sha, files = self._snapshot(self._repo(repo), rev)
        stored = files.get(path)
        if stored is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{stored.etag}"',
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
        }
        self._send(200, stored.content, headers, head=head)
