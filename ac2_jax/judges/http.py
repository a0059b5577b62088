"""An LLM proof judge over HTTP, speaking the OpenAI-compatible `/v1/chat/completions` protocol.

Failure policy (ALGORITHMS.md, AC2 item 4): whatever goes wrong with one request - refused
connection, timeout, 5xx, 429, 4xx, a body that is not a chat completion, a reply without
points - becomes an invalid `Grade` for that request; `grade_batch` never raises. Transient
failures (connection errors, timeouts, 5xx, 429, malformed bodies) are retried up to
`max_retries` times with exponential backoff; other 4xx are final at once. A request whose
response has no answer block scores 0 without touching the network.

The API key is read from the environment variable named in the settings and stripped of
surrounding whitespace (secret files usually end in a newline); a key that still holds whitespace
or control characters is refused at construction, without printing it. It is sent only as the
`Authorization: Bearer` header, and every grade's detail and judge output, and so every log line
made of them, is scrubbed of it in any form (raw, escaped, percent-encoded, base64: `secrets`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import logging
import os
import random
import threading
import time
import urllib.parse
from typing import Sequence

from ac2_jax.judges import grading
from ac2_jax.judges import secrets
from ac2_jax.judges import templates

logger = logging.getLogger(__name__)

_DETAIL_CHARS = 200  # how much of a refusing server's body an invalid grade's detail keeps


@dataclasses.dataclass(frozen=True)
class HttpJudgeSettings:
  """Where and how to reach the judge model."""

  # Root of the OpenAI-compatible API, e.g. 'http://127.0.0.1:8000/v1'; requests go to
  # base_url + '/chat/completions'.
  base_url: str
  model: str
  mode: templates.Mode = 'training'  # which template: 'training' or 'validation'
  # Name of the environment variable holding the API key; None sends no Authorization header.
  api_key_env: str | None = None
  max_concurrency: int = 32  # requests in flight at once
  timeout_s: float = 600.0  # per socket operation (connect, send, each read)
  max_retries: int = 5  # retries after the first attempt, for transient failures only
  backoff_base_s: float = 1.0  # retry k waits about base * 2**(k-1) seconds (jittered)
  backoff_max_s: float = 60.0
  temperature: float | None = None  # None leaves the server's default
  max_tokens: int | None = None
  # A JSON object merged into every request body (e.g. '{"reasoning_effort": "high"}').
  extra_body_json: str = ''

  def __post_init__(self):
    parsed = urllib.parse.urlsplit(self.base_url)
    if parsed.scheme not in ('http', 'https') or not parsed.hostname:
      raise ValueError(f'judge base_url must be an http(s) URL with a host; got {self.base_url!r}')
    if not self.model:
      raise ValueError('judge model name is empty')
    if self.mode not in templates.MODES:
      raise ValueError(f'unknown judge mode {self.mode!r}; choose one of {templates.MODES}')
    if self.max_concurrency < 1:
      raise ValueError(f'max_concurrency must be >= 1; got {self.max_concurrency}')
    if not self.timeout_s > 0:
      raise ValueError(f'timeout_s must be > 0; got {self.timeout_s}')
    if self.max_retries < 0:
      raise ValueError(f'max_retries must be >= 0; got {self.max_retries}')
    if self.backoff_base_s < 0 or self.backoff_max_s < 0:
      raise ValueError('backoff times must be >= 0')
    if self.extra_body_json:
      try:
        extra = json.loads(self.extra_body_json)
      except json.JSONDecodeError as e:
        raise ValueError(f'extra_body_json is not valid JSON: {e}') from None
      if not isinstance(extra, dict):
        raise ValueError('extra_body_json must be a JSON object')


@dataclasses.dataclass(frozen=True)
class _Outcome:
  """One HTTP attempt, classified."""

  grade: grading.Grade | None = None  # final: stop and return this (attempts filled in later)
  status: str = ''  # transient failure: the status an invalid grade would carry
  detail: str = ''
  retry_after_s: float = 0.0


class HttpJudge:
  """Grades proofs with an LLM behind an OpenAI-compatible endpoint; thread-safe."""

  def __init__(self, settings: HttpJudgeSettings):
    self.settings = settings
    self._api_key = ''
    self._scrub = secrets.Scrubber()
    if settings.api_key_env is not None:
      raw = os.environ.get(settings.api_key_env, '')
      key = raw.strip()
      if not key:
        raise ValueError(f'environment variable {settings.api_key_env} (the judge API key) is '
                         'not set or empty')
      if not key.isascii() or any(c.isspace() or not c.isprintable() for c in key):
        raise ValueError(f'environment variable {settings.api_key_env} (the judge API key) holds '
                         'whitespace, control or non-ASCII characters inside it; an HTTP header '
                         'cannot carry them')
      self._api_key = key
      # The unstripped value too: its escaped forms (a trailing '\n') differ from the key's.
      self._scrub = secrets.Scrubber(key, raw)
    url = urllib.parse.urlsplit(settings.base_url)
    self._https = url.scheme == 'https'
    self._host = url.hostname
    self._port = url.port or (443 if self._https else 80)
    self._path = url.path.rstrip('/') + '/chat/completions'
    self._extra = json.loads(settings.extra_body_json) if settings.extra_body_json else {}
    self._local = threading.local()  # one keep-alive connection per worker thread
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=settings.max_concurrency, thread_name_prefix='http-judge')

  def close(self) -> None:
    self._pool.shutdown(wait=True)

  def __enter__(self) -> HttpJudge:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __repr__(self) -> str:
    # Never the key, only where it comes from.
    s = self.settings
    return f'HttpJudge(base_url={s.base_url!r}, model={s.model!r}, mode={s.mode!r})'

  def grade(self, request: templates.JudgeRequest) -> grading.Grade:
    return self.grade_batch([request])[0]

  def grade_batch(self, requests: Sequence[templates.JudgeRequest]) -> list[grading.Grade]:
    """Grades all requests, at most `max_concurrency` in flight; never raises."""
    grades: list[grading.Grade | None] = [None] * len(requests)
    futures = {}
    for i, request in enumerate(requests):
      try:
        if request.proof is None:
          grades[i] = grading.no_answer_grade()
          continue
        body = self._request_body(templates.build_messages(request, self.settings.mode))
        futures[i] = self._pool.submit(self._grade_one, body)
      except Exception as e:  # a bad request must not sink the batch
        grades[i] = grading.invalid_grade(grading.STATUS_INTERNAL_ERROR,
                                          self._scrub(f'{type(e).__name__}: {e}'))
    for i, future in futures.items():
      try:
        grades[i] = future.result()
      except Exception as e:
        grades[i] = grading.invalid_grade(grading.STATUS_INTERNAL_ERROR,
                                          self._scrub(f'{type(e).__name__}: {e}'))
    grades = [self._scrubbed(g) for g in grades]
    for i, g in enumerate(grades):
      if not g.valid:
        logger.warning('judge request %d invalid (%s): %s', i, g.status, g.detail)
    return grades  # type: ignore[return-value]

  # ---------------------------------------------------------------- one request, with retries

  def _request_body(self, messages: list[dict[str, str]]) -> bytes:
    body: dict = {'model': self.settings.model, 'messages': messages}
    if self.settings.temperature is not None:
      body['temperature'] = self.settings.temperature
    if self.settings.max_tokens is not None:
      body['max_tokens'] = self.settings.max_tokens
    body.update(self._extra)
    return json.dumps(body).encode('utf-8')

  def _grade_one(self, body: bytes) -> grading.Grade:
    s = self.settings
    outcome = _Outcome()
    attempts = 0
    for retry in range(s.max_retries + 1):
      if retry:
        delay = min(s.backoff_max_s, s.backoff_base_s * 2 ** (retry - 1))
        # Jitter spreads the retries of requests that failed together (a 429 burst).
        delay *= 0.5 + 0.5 * random.random()
        delay = min(s.backoff_max_s, max(delay, outcome.retry_after_s))
        logger.debug('judge retry %d after %.3fs (%s)', retry, delay, outcome.status)
        time.sleep(delay)
      attempts += 1
      outcome = self._attempt(body)
      if outcome.grade is not None:
        return dataclasses.replace(outcome.grade, attempts=attempts)
    return grading.invalid_grade(
        outcome.status, self._scrub(f'{outcome.detail} (gave up after {attempts} attempts)'),
        attempts=attempts)

  def _attempt(self, body: bytes) -> _Outcome:
    try:
      status, data, retry_after = self._post(body)
    except TimeoutError as e:
      return _Outcome(status=grading.STATUS_TIMEOUT,
                      detail=f'no answer within {self.settings.timeout_s}s ({e})')
    except (OSError, http.client.HTTPException) as e:
      return _Outcome(status=grading.STATUS_CONNECTION_ERROR,
                      detail=f'{type(e).__name__}: {e}')
    if status == 429 or status >= 500:
      return _Outcome(status=grading.STATUS_HTTP_ERROR, detail=f'HTTP {status}',
                      retry_after_s=retry_after)
    if status != 200:
      # Scrubbed before it is cut, so a key at the cut cannot leave a fragment behind.
      snippet = self._scrub(data.decode('utf-8', 'replace'))[:_DETAIL_CHARS]
      return _Outcome(grade=grading.invalid_grade(
          grading.STATUS_HTTP_ERROR, f'HTTP {status} (not retried): {snippet}'))
    text = _completion_text(data)
    if text is None:
      return _Outcome(status=grading.STATUS_BAD_RESPONSE,
                      detail='body is not an OpenAI-style chat completion')
    return _Outcome(grade=grading.grade_from_judge_output(text))

  # ---------------------------------------------------------------- transport

  def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
    conn = getattr(self._local, 'conn', None)
    if conn is not None:
      return conn, True
    cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
    conn = cls(self._host, self._port, timeout=self.settings.timeout_s)
    self._local.conn = conn
    return conn, False

  def _drop_connection(self) -> None:
    conn = getattr(self._local, 'conn', None)
    self._local.conn = None
    if conn is not None:
      conn.close()

  def _post(self, body: bytes) -> tuple[int, bytes, float]:
    conn, reused = self._connection()
    try:
      return self._exchange(conn, body)
    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
      self._drop_connection()
      if not reused:
        raise
      # The server closed an idle keep-alive connection: one fresh try, not counted as a retry.
      conn, _ = self._connection()
      try:
        return self._exchange(conn, body)
      except BaseException:
        self._drop_connection()
        raise
    except BaseException:
      self._drop_connection()
      raise

  def _exchange(self, conn: http.client.HTTPConnection, body: bytes) -> tuple[int, bytes, float]:
    headers = {'Content-Type': 'application/json', 'Accept': 'application/json'}
    if self._api_key:
      headers['Authorization'] = f'Bearer {self._api_key}'
    conn.request('POST', self._path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.will_close:
      self._drop_connection()
    return response.status, data, _retry_after_s(response.getheader('Retry-After'))

  def _scrubbed(self, grade: grading.Grade) -> grading.Grade:
    """`grade` with its detail and judge output scrubbed of the key (a server may echo it)."""
    detail, output = self._scrub(grade.detail), self._scrub(grade.judge_output)
    if (detail, output) == (grade.detail, grade.judge_output):
      return grade
    return dataclasses.replace(grade, detail=detail, judge_output=output)


def _retry_after_s(value: str | None) -> float:
  try:
    return max(0.0, float(value)) if value else 0.0
  except ValueError:  # an HTTP date: fall back to our own backoff
    return 0.0


def _completion_text(data: bytes) -> str | None:
  """choices[0].message.content of a chat completion, or None when the body is not one."""
  try:
    payload = json.loads(data)
    content = payload['choices'][0]['message']['content']
  except (ValueError, KeyError, IndexError, TypeError):
    return None
  if isinstance(content, str):
    return content
  if content is None:
    return ''  # e.g. a reasoning model cut off by max_tokens: a reply, but without points
  if isinstance(content, list):  # content given as parts
    texts = [p.get('text', '') for p in content if isinstance(p, dict)]
    return ''.join(t for t in texts if isinstance(t, str))
  return None
