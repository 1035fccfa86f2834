"""A local HTTP server that speaks the OpenAI chat-completions and Anthropic messages APIs, with
scripted replies per model, recording every request it receives. Used by tests and benchmarks.

    with ScriptedLLM({"gpt-4o": [Reply(NO_COMPILE), Reply(GOOD)]}) as server:
        os.environ["OPENAI_BASE_URL"] = server.url + "/v1"   # Anthropic: server.url
        ...
        server.requests  # what the SDKs sent

Replies for a model are used in order; the last one repeats. The server stops when the block ends,
waking any reply that is still sleeping.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Reply:
    text: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0                              # seconds before answering
    usage: tuple[int, int] | None = (1000, 500)     # (input, output) tokens; None: no usage reported
    error: str = "scripted error"
    finish: str = ""                                # finish_reason / stop_reason; "": "stop" / "end_turn"
    reasoning_tokens: int = 0                       # OpenAI: usage.completion_tokens_details.reasoning_tokens


@dataclass
class Recorded:
    api: str                 # "openai" or "anthropic"
    model: str
    headers: dict[str, str]
    body: dict[str, Any]
    t: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body.get("messages", [])

    @property
    def system(self) -> str:
        if self.api == "anthropic":
            s = self.body.get("system", "")
            return s if isinstance(s, str) else "".join(b.get("text", "") for b in s)
        return next((m["content"] for m in self.messages if m["role"] == "system"), "")

    def last_user(self) -> str:
        return next((_text(m["content"]) for m in reversed(self.messages) if m["role"] == "user"), "")


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


Script = dict[str, list[Reply | str]] | Callable[[Recorded], Reply | str]


class ScriptedLLM:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[Recorded] = []
        self._served: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "ScriptedLLM":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def for_model(self, model: str) -> list[Recorded]:
        return [r for r in self.requests if r.model == model]

    def _next(self, rec: Recorded) -> Reply:
        if callable(self.script):
            reply = self.script(rec)
        else:
            with self._lock:
                replies = self.script[rec.model]
                i = self._served.get(rec.model, 0)
                self._served[rec.model] = i + 1
            reply = replies[min(i, len(replies) - 1)]
        return Reply(reply) if isinstance(reply, str) else reply

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                api = "anthropic" if self.path.rstrip("/").endswith("/messages") else "openai"
                rec = Recorded(api, body.get("model", ""), {k.lower(): v for k, v in self.headers.items()}, body,
                               time.monotonic())
                with outer._lock:
                    outer.requests.append(rec)
                reply = outer._next(rec)
                if reply.delay and outer._stop.wait(reply.delay):
                    return
                payload = _payload(api, rec.model, reply)
                try:
                    self.send_response(reply.status)
                    for k, v in {"content-type": "application/json", **reply.headers}.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client gave up (timeout)
                    pass

        return Handler


def _payload(api: str, model: str, reply: Reply) -> bytes:
    if reply.status >= 400:
        if api == "anthropic":
            doc: dict[str, Any] = {"type": "error", "error": {"type": "api_error", "message": reply.error}}
        else:
            doc = {"error": {"message": reply.error, "type": "api_error", "code": None}}
    elif api == "anthropic":
        doc = {"id": "msg_test", "type": "message", "role": "assistant", "model": model,
               "content": [{"type": "text", "text": reply.text}], "stop_reason": reply.finish or "end_turn", "stop_sequence": None}
        if reply.usage:
            doc["usage"] = {"input_tokens": reply.usage[0], "output_tokens": reply.usage[1]}
        else:
            doc["usage"] = {"input_tokens": None, "output_tokens": None}
    else:
        doc = {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text},
                            "finish_reason": reply.finish or "stop"}]}
        if reply.usage:
            doc["usage"] = {"prompt_tokens": reply.usage[0], "completion_tokens": reply.usage[1],
                            "total_tokens": sum(reply.usage),
                            "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens}}
    return json.dumps(doc).encode()
