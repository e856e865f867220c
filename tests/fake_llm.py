"""A small OpenAI-compatible HTTP server that tests start and script.

Chat completions answer from a queue of scripted replies (text, tool calls, HTTP errors,
delays, garbage); embeddings are deterministic hash vectors, of a width set per model, and
can be held back to catch a caller in the middle of its work; ``/rerank`` scores documents
with a function the test sets. The production ``openai``
client talks to it over real HTTP, unchanged.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np


@dataclass
class Reply:
    """One scripted answer to a chat completion request."""

    content: str | None = None
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, dict or raw str)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    raw_body: bytes | None = None  # sent as is (garbage, truncated JSON, …)
    drip: float = 0.0  # seconds between the body's bytes (a server that never quite stops)


def tool(name: str, arguments: Any) -> Reply:
    """A reply that calls one tool."""
    return Reply(tool_calls=[(name, arguments)])


def quiet(request: dict[str, Any]) -> Reply:
    """The historian's model once a script runs out: the rewrite keeps the rule drafts, and
    no profile or memory changes."""
    if request["tools"][0]["function"]["name"] == "submit_rewrite":
        prompt = request["messages"][1]["content"]
        items = [json.loads(x) for x in prompt.splitlines() if x.startswith('{"index"')]
        return tool(
            "submit_rewrite",
            {"rewrites": [{"index": i["index"], "text": i["draft"]} for i in items]},
        )
    return Reply(content="nothing to change")


def hash_vector(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for a text (same text → same vector)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(dim)
    return (vector / np.linalg.norm(vector)).tolist()


class FakeLLM:
    """The server and its script; ``base_url`` is what the service is configured with."""

    def __init__(self, embedding_dim: int = 384) -> None:
        self.embedding_dim = embedding_dim
        self.embedding_dims: dict[str, int] = {}  # per model; others get embedding_dim
        self.embeddings_waiting = 0
        self._passes: int | None = None  # embedding requests let through before holding
        self._released = threading.Event()
        self._released.set()
        self.replies: deque[Reply] = deque()
        self.default: Callable[[dict[str, Any]], Reply] | None = None
        self.chat_requests: list[dict[str, Any]] = []
        self.embedding_requests: list[dict[str, Any]] = []
        # The next embedding answers drip in: a byte every so many seconds, one entry each.
        self.embedding_drips: deque[float] = deque()
        # ``/rerank`` scores each document with this (query, document) -> score; None: 500.
        self.rerank: Callable[[str, str], float] | None = None
        self.rerank_delay = 0.0
        self.rerank_drip = 0.0  # seconds between the bytes of its answers
        self.rerank_requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def script(self, *replies: Reply) -> None:
        """Queue replies, answered in order."""
        with self._lock:
            self.replies.extend(replies)

    def reset(self) -> None:
        self.release_embeddings()
        with self._lock:
            self.replies.clear()
            self.default = None
            self.chat_requests.clear()
            self.embedding_requests.clear()
            self.embedding_drips.clear()
            self.rerank = None
            self.rerank_delay = 0.0
            self.rerank_drip = 0.0
            self.rerank_requests.clear()
            self.embedding_dims.clear()

    def hold_embeddings(self, after: int = 0) -> None:
        """Answer ``after`` more embedding requests, then hold the rest until released."""
        with self._lock:
            self._passes = after
            self._released.clear()

    def release_embeddings(self) -> None:
        """Answer held embedding requests, and every later one at once."""
        with self._lock:
            self._passes = None
            self._released.set()

    def _admit_embedding(self, request: dict[str, Any]) -> bool:
        """Record a request; True when it must wait for a release."""
        with self._lock:
            self.embedding_requests.append(request)
            if self._passes is None:
                return False
            if self._passes > 0:
                self._passes -= 1
                return False
            self.embeddings_waiting += 1
            return True

    def _next_reply(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self.chat_requests.append(request)
            if self.replies:
                return self.replies.popleft()
        if self.default is not None:
            return self.default(request)
        return Reply(status=500, raw_body=b'{"error": {"message": "no scripted reply"}}')

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(
                self,
                status: int,
                body: bytes,
                headers: dict[str, str] | None = None,
                drip: float = 0.0,
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                if not drip:
                    self.wfile.write(body)
                    return
                with contextlib.suppress(OSError):  # the caller may give up on it
                    for byte in body:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(drip)

            def _rerank(self, request: dict[str, Any]) -> None:
                fake.rerank_requests.append(request)
                if fake.rerank_delay:
                    time.sleep(fake.rerank_delay)
                if fake.rerank is None:
                    self._send(500, b'{"error": {"message": "no reranker scripted"}}')
                    return
                scores = [fake.rerank(request["query"], d) for d in request["documents"]]
                ranked = sorted(enumerate(scores), key=lambda pair: -pair[1])
                results = [{"index": i, "relevance_score": score} for i, score in ranked]
                self._send(200, json.dumps({"results": results}).encode(), drip=fake.rerank_drip)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                if self.path.endswith("/embeddings"):
                    if fake._admit_embedding(request):
                        fake._released.wait(timeout=60)
                        with fake._lock:
                            fake.embeddings_waiting -= 1
                    inputs = request["input"]
                    inputs = [inputs] if isinstance(inputs, str) else inputs
                    dim = fake.embedding_dims.get(request.get("model", ""), fake.embedding_dim)
                    # As a real server does: base64 little-endian float32 when asked (the
                    # client library asks by default, and parses a float list slowly).
                    packed = request.get("encoding_format") == "base64"
                    data = [
                        {
                            "object": "embedding",
                            "index": i,
                            "embedding": (
                                base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
                                if packed
                                else vector
                            ),
                        }
                        for i, vector in enumerate(hash_vector(t, dim) for t in inputs)
                    ]
                    body = {
                        "object": "list",
                        "data": data,
                        "model": request.get("model"),
                        "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    }
                    with fake._lock:
                        drip = fake.embedding_drips.popleft() if fake.embedding_drips else 0.0
                    # The caller may have given up on a held request meanwhile.
                    with contextlib.suppress(OSError):
                        self._send(200, json.dumps(body).encode(), drip=drip)
                    return
                if self.path.endswith("/rerank"):
                    self._rerank(request)
                    return
                if not self.path.endswith("/chat/completions"):
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                reply = fake._next_reply(request)
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.raw_body is not None or reply.status != 200:
                    body = (
                        reply.raw_body
                        if reply.raw_body is not None
                        else json.dumps({"error": {"message": f"scripted {reply.status}"}}).encode()
                    )
                    self._send(reply.status, body, reply.headers)
                    return
                message: dict[str, Any] = {"role": "assistant", "content": reply.content}
                if reply.tool_calls:
                    message["tool_calls"] = [
                        {
                            "id": f"call_{uuid.uuid4().hex[:8]}",
                            "type": "function",
                            "function": {
                                "name": name,
                                "arguments": args
                                if isinstance(args, str)
                                else json.dumps(args, ensure_ascii=False),
                            },
                        }
                        for name, args in reply.tool_calls
                    ]
                body = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": request.get("model", "fake"),
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }
                self._send(200, json.dumps(body).encode(), reply.headers, reply.drip)

        return Handler
