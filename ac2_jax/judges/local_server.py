"""A real OpenAI-compatible chat-completions server on localhost, for tests and benchmarks.

It runs `http.server.ThreadingHTTPServer` in a background thread, speaks HTTP/1.1 with
keep-alive, records every request it receives, and answers each with whatever the caller's
`reply` function decides (status, body, delay) - so a test can script well-formed answers,
garbage, 5xx, 429, 4xx and slow answers against the real `HttpJudge` transport.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time
from typing import Any, Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Reply:
  status: int = 200
  body: bytes | str | dict = b''
  delay_s: float = 0.0  # sleep before answering (a slow judge)
  headers: tuple[tuple[str, str], ...] = ()
  # Close the connection after answering without announcing it (a server's idle timeout).
  drop_connection: bool = False


@dataclasses.dataclass(frozen=True)
class ReceivedRequest:
  path: str
  headers: Mapping[str, str]
  body: Any  # the parsed JSON body, or the raw bytes when it was not JSON


def completion_body(content: str, model: str = 'local-judge') -> dict:
  """A minimal OpenAI chat-completion response carrying `content`."""
  return {
      'id': 'chatcmpl-local', 'object': 'chat.completion', 'model': model,
      'choices': [{'index': 0, 'finish_reason': 'stop',
                   'message': {'role': 'assistant', 'content': content}}],
  }


ReplyFn = Callable[[ReceivedRequest], Reply]


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True
  # The default backlog of 5 drops connections when a judge opens 32 at once.
  request_queue_size = 256


class LocalChatServer:
  """`with LocalChatServer(reply) as server:` then point a judge at `server.base_url`."""

  def __init__(self, reply: ReplyFn, host: str = '127.0.0.1', port: int = 0):
    self._reply = reply
    self._lock = threading.Lock()
    self._requests: list[ReceivedRequest] = []
    owner = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = 'HTTP/1.1'
      # Headers and body go out in two writes; with Nagle on, the body waits for the client's
      # delayed ACK (~40 ms) - a latency no real judge server adds.
      disable_nagle_algorithm = True

      def do_POST(self):  # noqa: N802 (http.server's naming)
        length = int(self.headers.get('Content-Length') or 0)
        raw = self.rfile.read(length)
        try:
          body = json.loads(raw)
        except ValueError:
          body = raw
        received = ReceivedRequest(self.path, dict(self.headers.items()), body)
        with owner._lock:
          owner._requests.append(received)
        if self.path.rstrip('/').endswith('/chat/completions'):
          reply = owner._reply(received)
        else:
          reply = Reply(404, {'error': {'message': f'no route {self.path}'}})
        if reply.delay_s:
          time.sleep(reply.delay_s)
        payload = reply.body
        if isinstance(payload, dict):
          payload = json.dumps(payload)
        if isinstance(payload, str):
          payload = payload.encode('utf-8')
        try:
          self.send_response(reply.status)
          self.send_header('Content-Type', 'application/json')
          self.send_header('Content-Length', str(len(payload)))
          for name, value in reply.headers:
            self.send_header(name, value)
          self.end_headers()
          self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
          pass  # the client gave up (timeout): nothing to answer to
        if reply.drop_connection:
          self.close_connection = True

      def log_message(self, *args):  # keep test and benchmark output clean
        pass

    self._server = _Server((host, port), Handler)
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                    name='local-chat-server')

  @property
  def base_url(self) -> str:
    host, port = self._server.server_address[:2]
    return f'http://{host}:{port}/v1'

  @property
  def requests(self) -> list[ReceivedRequest]:
    with self._lock:
      return list(self._requests)

  def start(self) -> LocalChatServer:
    self._thread.start()
    return self

  def stop(self) -> None:
    self._server.shutdown()
    self._server.server_close()
    self._thread.join()

  def __enter__(self) -> LocalChatServer:
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()
