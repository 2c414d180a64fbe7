"""An HTTP proxy in front of a real S3 server (moto, rclone) that damages chosen
responses: the faults a flaky network or load balancer gives, which no S3 server
emulator produces by itself.

    proxy = FaultProxy(upstream_endpoint).start()
    proxy.cut_body("GET", "/LATEST", times=1)   # a 200 whose body stops half-way
    store = open_store(url, endpoint_url=proxy.endpoint)

Each rule applies to the next ``times`` requests whose method matches and whose path
ends with the given suffix; everything else is forwarded untouched.
"""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class _Rule:
    method: str
    suffix: str
    times: int
    status: int | None = None  # answer this instead of forwarding; None: cut the body
    delay_s: float = 0.0  # forward intact, this much later


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.rules: list[_Rule] = []
        self.hits = 0  # damaged responses sent
        self.delayed = threading.Event()  # a delayed request has arrived
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def cut_body(self, method: str, suffix: str, times: int = 1) -> None:
        with self._lock:
            self.rules.append(_Rule(method, suffix, times))

    def fail(self, method: str, suffix: str, status: int = 503, times: int = 10**9) -> None:
        """Answer ``status`` without forwarding (until :meth:`clear`)."""
        with self._lock:
            self.rules.append(_Rule(method, suffix, times, status))

    def delay(self, method: str, suffix: str, seconds: float, times: int = 1) -> None:
        """Hold the next matching requests ``seconds`` before forwarding them;
        :attr:`delayed` is set when the first one arrives."""
        with self._lock:
            self.rules.append(_Rule(method, suffix, times, delay_s=seconds))

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _take(self, method: str, path: str) -> _Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.times > 0 and rule.method == method and \
                        path.split("?")[0].endswith(rule.suffix):
                    rule.times -= 1
                    self.hits += 1
                    return rule
        return None

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _forward(self) -> None:
                body = self._body()
                rule = proxy._take(self.command, self.path)
                if rule is not None and rule.delay_s:
                    proxy.delayed.set()
                    time.sleep(rule.delay_s)
                    rule = None  # then forwarded as it is
                if rule is not None and rule.status is not None:
                    self.send_response(rule.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                # the Host header as signed (SigV4 covers it): the server routes by path
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() != "transfer-encoding"}
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                cut = rule is not None and len(data) > 1
                self.send_response(resp.status)
                drop = ("transfer-encoding", "connection") + (
                    () if self.command == "HEAD" else ("content-length",))
                for k, v in resp.getheaders():
                    if k.lower() not in drop:
                        self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                if cut:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if cut else data)
                if cut:
                    self.close_connection = True
                conn.close()

            def _body(self) -> bytes | None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                        if size == 0:
                            return b"".join(chunks)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
