"""A Hugging Face Hub-compatible endpoint on 127.0.0.1, for testing real downloads offline.

It answers the two requests `huggingface_hub.hf_hub_download` makes for a
file: HEAD (metadata: ETag, X-Repo-Commit, Content-Length) and GET (the
bytes), at `/{repo_id}/resolve/{revision}/{filename}`. A missing repository
or file gets the 404 and `X-Error-Code` header the real Hub sends, which
`huggingface_hub` turns into RepositoryNotFoundError / EntryNotFoundError.
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<revision>[^/]+)/(?P<filename>[^?]+)")


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self._answer(with_body=False)

            def do_GET(self) -> None:
                self._answer(with_body=True)

            def _answer(self, with_body: bool) -> None:
                hub.requests.append((self.command, self.path))
                match = _RESOLVE.match(self.path)
                repo = hub.repos.get(match["repo"]) if match else None
                if repo is None:
                    return self._missing("RepoNotFound")
                data = repo.get(match["filename"])
                if data is None:
                    return self._missing("EntryNotFound")
                self.send_response(200)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if with_body:
                    self.wfile.write(data)

            def _missing(self, code: str) -> None:
                self.send_response(404)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def add_directory(self, repo_id: str, directory: Path) -> None:
        self.repos[repo_id] = {p.name: p.read_bytes() for p in Path(directory).iterdir() if p.is_file()}

    def files_fetched(self, repo_id: str) -> set[str]:
        """Files whose bytes were downloaded (GET), not just looked at."""
        prefix = f"/{repo_id}/resolve/"
        return {
            path.split("/resolve/", 1)[1].split("/", 1)[1]
            for method, path in self.requests
            if method == "GET" and path.startswith(prefix)
        }

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
