"""Judges: points parsing, templates, and the HTTP judge against a real localhost server."""

import base64
import collections
import logging
import socket
import threading
import time

import pytest

from ac2_jax.judges import grading
from ac2_jax.judges import local_server
from ac2_jax.judges import secrets
from ac2_jax.judges import templates
from ac2_jax.judges.http import HttpJudge, HttpJudgeSettings
from ac2_jax.judges.templates import JudgeRequest

KEY_ENV = 'AC2_TEST_JUDGE_KEY'
SECRET = 'sk-test-5ecret-abc123'


# ------------------------------------------------------------------------------ points parsing

@pytest.mark.parametrize('text, expected', [
    ('Reasoning... <points>5 out of 7</points>', (5, 'ok')),
    ('<points> 0 out of 7 </points>', (0, 'ok')),
    ('<POINTS>7 Out Of 7</POINTS>', (7, 'ok')),
    ('<points>3</points>', (3, 'ok')),
    ('I would give this 4 out of 7.', (4, 'ok')),
    ('4 out of 7 overall', (4, 'ok')),
    # The tagged form wins over a bare mention anywhere else.
    ('Worth 2 out of 7 at first... final: <points>6 out of 7</points>', (6, 'ok')),
    ('<points>1</points> but 6 out of 7 elsewhere', (1, 'ok')),
    ('<points>6 out of 7</points> and <points>2</points>', (6, 'ok')),
    # Within a form, the last occurrence is the verdict.
    ('scale <points>N out of 7</points>; verdict <points>2 out of 7</points>', (2, 'ok')),
    ('first 1 out of 7, then revised to 3 out of 7', (3, 'ok')),
    ('<points>9 out of 7</points>', (None, 'out_of_range')),
    ('<points>-1</points>', (None, 'out_of_range')),
    ('<points>3.5 out of 7</points>', (None, 'out_of_range')),
    ('<points>8</points>', (None, 'out_of_range')),
    ('12 out of 7', (None, 'out_of_range')),
    ('<points>4.0</points>', (4, 'ok')),
    ('This proof is fine.', (None, 'unparseable')),
    ('<points>five</points>', (None, 'unparseable')),
    ('3 out of 10', (None, 'unparseable')),
    ('17 out of 70', (None, 'unparseable')),
    ('3 out of 7.5', (None, 'unparseable')),
    ('', (None, 'unparseable')),
])
def test_parse_points(text, expected):
  assert grading.parse_points(text) == expected


def test_parse_points_non_string_is_unparseable():
  assert grading.parse_points(None) == (None, 'unparseable')


def test_grade_invariants_and_reward():
  assert grading.Grade(7).reward == 1.0
  assert grading.Grade(3).reward == pytest.approx(3 / 7)
  assert grading.no_answer_grade().points == 0 and grading.no_answer_grade().valid
  bad = grading.invalid_grade('timeout', 'slow')
  assert not bad.valid and bad.reward == 0.0
  with pytest.raises(ValueError, match='outside'):
    grading.Grade(8)
  with pytest.raises(ValueError, match='needs points'):
    grading.Grade(None, status='ok')
  with pytest.raises(ValueError, match='cannot carry points'):
    grading.Grade(3, status='timeout')


def test_grade_from_judge_output():
  g = grading.grade_from_judge_output('ok <points>4 out of 7</points>', attempts=2)
  assert (g.points, g.status, g.attempts) == (4, 'ok', 2)
  assert g.judge_output.startswith('ok')
  assert grading.grade_from_judge_output('nothing').status == 'unparseable'


# ------------------------------------------------------------------------------ templates

def test_training_template_has_problem_and_proof_only():
  req = JudgeRequest('Prove P.', 'Since Q, P.', reference_solution='REF', grading_guidelines='GG')
  msgs = templates.build_messages(req, 'training')
  assert [m['role'] for m in msgs] == ['system', 'user']
  user = msgs[1]['content']
  assert 'Prove P.' in user and 'Since Q, P.' in user
  assert 'REF' not in user and 'GG' not in user
  assert '<points>N out of 7</points>' in user


def test_validation_template_adds_reference_and_guidelines():
  req = JudgeRequest('Prove P.', 'Since Q, P.', reference_solution='REF SOL',
                     grading_guidelines='GUIDE 1')
  user = templates.build_messages(req, 'validation')[1]['content']
  for piece in ('Prove P.', 'Since Q, P.', 'REF SOL', 'GUIDE 1'):
    assert piece in user
  assert user.index('Prove P.') < user.index('REF SOL') < user.index('Since Q, P.')


def test_template_errors():
  with pytest.raises(ValueError, match='reference solution'):
    templates.build_messages(JudgeRequest('p', 'q', grading_guidelines='g'), 'validation')
  with pytest.raises(ValueError, match='grading guidelines'):
    templates.build_messages(JudgeRequest('p', 'q', reference_solution='r'), 'validation')
  with pytest.raises(ValueError, match='no judge prompt'):
    templates.build_messages(JudgeRequest('p', None), 'training')
  with pytest.raises(ValueError, match='unknown judge mode'):
    templates.build_messages(JudgeRequest('p', 'q'), 'exam')


# ------------------------------------------------------------------------------ settings

@pytest.mark.parametrize('kwargs, match', [
    (dict(base_url='ftp://x/v1'), 'http'),
    (dict(base_url='not a url'), 'http'),
    (dict(model=''), 'model'),
    (dict(mode='exam'), 'mode'),
    (dict(max_concurrency=0), 'max_concurrency'),
    (dict(timeout_s=0), 'timeout_s'),
    (dict(max_retries=-1), 'max_retries'),
    (dict(extra_body_json='{bad'), 'extra_body_json'),
    (dict(extra_body_json='[1]'), 'JSON object'),
])
def test_settings_validation(kwargs, match):
  base = dict(base_url='http://127.0.0.1:1/v1', model='m')
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    HttpJudgeSettings(**base)


def test_missing_key_env_is_a_clear_error(monkeypatch):
  monkeypatch.delenv(KEY_ENV, raising=False)
  with pytest.raises(ValueError, match=KEY_ENV):
    HttpJudge(HttpJudgeSettings('http://127.0.0.1:1/v1', 'm', api_key_env=KEY_ENV))


# ------------------------------------------------------------------------------ HTTP judge

class Script:
  """Server behaviour keyed by the problem text, counting requests per problem."""

  def __init__(self):
    self.calls = collections.Counter()
    self.lock = threading.Lock()
    self.in_flight = 0
    self.max_in_flight = 0

  def __call__(self, req: local_server.ReceivedRequest) -> local_server.Reply:
    user = req.body['messages'][1]['content']
    case = user.split('<problem>\n', 1)[1].split('\n', 1)[0]
    with self.lock:
      self.calls[case] += 1
      n = self.calls[case]
    ok = local_server.completion_body('Looks right. <points>5 out of 7</points>')
    if case == 'well':
      return local_server.Reply(200, ok)
    if case == 'mode-check':
      # The validation template reached the server with its extra sections.
      good = 'REFERENCE-TEXT' in user and 'GUIDELINE-TEXT' in user
      return local_server.Reply(200, local_server.completion_body(
          '<points>7</points>' if good else '<points>0</points>'))
    if case == 'garbage-text':
      return local_server.Reply(200, local_server.completion_body('I refuse to grade.'))
    if case == 'garbage-body':
      return local_server.Reply(200, '<html>gateway</html>')
    if case == 'out-of-range':
      return local_server.Reply(200, local_server.completion_body('<points>9 out of 7</points>'))
    if case == 'flaky-500':
      return local_server.Reply(500, 'oops') if n == 1 else local_server.Reply(200, ok)
    if case == 'always-500':
      return local_server.Reply(503, 'down')
    if case == 'rate-limited':
      if n <= 2:
        return local_server.Reply(429, {'error': 'slow down'}, headers=(('Retry-After', '0'),))
      return local_server.Reply(200, ok)
    if case == 'always-429':
      return local_server.Reply(429, {'error': 'slow down'})
    if case == 'bad-request':
      return local_server.Reply(400, {'error': {'message': 'bad model'}})
    if case == 'echo-key':
      # A hostile server echoing the credentials back in an error body.
      return local_server.Reply(401, {'error': req.headers.get('Authorization', '')})
    if case == 'echo-key-forms':
      # The key echoed back raw, escaped, percent-encoded and base64-encoded, in a valid reply.
      key = req.headers.get('Authorization', '').removeprefix('Bearer ')
      forms = [key, repr(key + '\n'), repr(key.encode()), base64.b64encode(key.encode()).decode(),
               base64.b64encode(f'user:{key}'.encode()).decode(),
               base64.urlsafe_b64encode(f'xy{key}'.encode()).decode()]
      return local_server.Reply(200, local_server.completion_body(
          ' | '.join(forms) + ' <points>6 out of 7</points>'))
    if case == 'echo-key-at-cut':
      # The key straddles the cut of the error body kept in the detail.
      return local_server.Reply(403, 'x' * 190 + req.headers.get('Authorization', ''))
    if case == 'slow':
      return local_server.Reply(200, ok, delay_s=1.5)
    if case == 'concurrency':
      with self.lock:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
      time.sleep(0.2)
      with self.lock:
        self.in_flight -= 1
      return local_server.Reply(200, ok)
    return local_server.Reply(200, local_server.completion_body('no case'))


@pytest.fixture
def server():
  script = Script()
  with local_server.LocalChatServer(script) as srv:
    srv.script = script
    yield srv


def _settings(srv, **kw):
  base = dict(base_url=srv.base_url, model='judge-model', max_concurrency=8, timeout_s=5.0,
              max_retries=5, backoff_base_s=0.001, backoff_max_s=0.01)
  base.update(kw)
  return HttpJudgeSettings(**base)


def test_every_outcome_in_one_batch(server):
  cases = ['well', 'garbage-text', 'garbage-body', 'out-of-range', 'flaky-500', 'always-500',
           'rate-limited', 'always-429', 'bad-request']
  requests = [JudgeRequest(c, 'my proof') for c in cases] + [JudgeRequest('no-answer', None)]
  with HttpJudge(_settings(server)) as judge:
    grades = dict(zip(cases + ['no-answer'], judge.grade_batch(requests)))
  calls = server.script.calls
  expect = {  # case: (points, status, attempts, requests the server saw)
      'well': (5, 'ok', 1, 1),
      'garbage-text': (None, 'unparseable', 1, 1),  # a real reply without points: no retry
      'garbage-body': (None, 'bad_response', 6, 6),  # not a completion: transient, 5 retries
      'out-of-range': (None, 'out_of_range', 1, 1),
      'flaky-500': (5, 'ok', 2, 2),
      'always-500': (None, 'http_error', 6, 6),
      'rate-limited': (5, 'ok', 3, 3),
      'always-429': (None, 'http_error', 6, 6),
      'bad-request': (None, 'http_error', 1, 1),  # 4xx other than 429: never retried
      'no-answer': (0, 'no_answer', 0, 0),  # scored locally, no request
  }
  for case, (points, status, attempts, seen) in expect.items():
    g = grades[case]
    assert (g.points, g.status, g.attempts, calls[case]) == (points, status, attempts, seen), case
  assert 'HTTP 400' in grades['bad-request'].detail and 'bad model' in grades['bad-request'].detail
  assert '6 attempts' in grades['always-500'].detail
  assert grades['garbage-text'].judge_output == 'I refuse to grade.'
  assert all(r.body['model'] == 'judge-model' for r in server.requests)
  assert all(r.path == '/v1/chat/completions' for r in server.requests)


def test_slow_server_times_out_as_invalid_grade(server):
  with HttpJudge(_settings(server, timeout_s=0.2, max_retries=1)) as judge:
    slow, well = judge.grade_batch([JudgeRequest('slow', 'p'), JudgeRequest('well', 'p')])
  assert (slow.points, slow.status, slow.attempts) == (None, 'timeout', 2)
  assert server.script.calls['slow'] == 2
  assert well.points == 5  # the other request is unaffected


def test_refused_connection_is_an_invalid_grade():
  with socket.socket() as sock:  # a port that was free a moment ago: nobody listens on it
    sock.bind(('127.0.0.1', 0))
    url = f'http://127.0.0.1:{sock.getsockname()[1]}/v1'
  settings = HttpJudgeSettings(url, 'm', max_retries=2, backoff_base_s=0.001, timeout_s=2.0)
  with HttpJudge(settings) as judge:
    (g,) = judge.grade_batch([JudgeRequest('well', 'p')])
  assert (g.points, g.status, g.attempts) == (None, 'connection_error', 3)


def test_validation_mode_and_extra_body(server):
  settings = _settings(server, mode='validation', temperature=0.0, max_tokens=64,
                       extra_body_json='{"reasoning_effort": "low"}')
  req = JudgeRequest('mode-check', 'p', reference_solution='REFERENCE-TEXT',
                     grading_guidelines='GUIDELINE-TEXT')
  bad = JudgeRequest('well', 'p')  # no reference: the validation template refuses it
  with HttpJudge(settings) as judge:
    good, refused = judge.grade_batch([req, bad])
  assert good.points == 7
  assert (refused.points, refused.status) == (None, 'internal_error')
  assert 'reference solution' in refused.detail
  body = server.requests[0].body
  assert body['temperature'] == 0.0 and body['max_tokens'] == 64
  assert body['reasoning_effort'] == 'low'
  assert server.script.calls['well'] == 0


def test_api_key_sent_as_bearer_and_never_logged(server, monkeypatch, caplog):
  monkeypatch.setenv(KEY_ENV, SECRET)
  caplog.set_level(logging.DEBUG)
  with HttpJudge(_settings(server, api_key_env=KEY_ENV)) as judge:
    grades = judge.grade_batch([JudgeRequest('well', 'p'), JudgeRequest('echo-key', 'p'),
                                JudgeRequest('always-500', 'p')])
    text = repr(judge) + repr(judge.settings)
  assert grades[0].points == 5
  assert all(r.headers['Authorization'] == f'Bearer {SECRET}' for r in server.requests)
  echoed = grades[1]
  assert (echoed.status, echoed.attempts) == ('http_error', 1)
  assert 'HTTP 401' in echoed.detail and '[redacted]' in echoed.detail
  everything = text + caplog.text + ''.join(g.detail + g.judge_output for g in grades)
  assert SECRET not in everything
  assert 'invalid (http_error)' in caplog.text  # failures are logged, just without the key


def test_api_key_with_trailing_newline_is_stripped_and_scrubbed_in_every_form(
    server, monkeypatch, caplog):
  # A key read from a secret file keeps the file's newline.
  monkeypatch.setenv(KEY_ENV, f'  {SECRET}\n')
  caplog.set_level(logging.DEBUG)
  with HttpJudge(_settings(server, api_key_env=KEY_ENV, max_retries=0)) as judge:
    grades = judge.grade_batch([JudgeRequest('well', 'p'), JudgeRequest('echo-key-forms', 'p'),
                                JudgeRequest('echo-key-at-cut', 'p'),
                                JudgeRequest('echo-key', 'p')])
  assert [r.headers['Authorization'] for r in server.requests] == [f'Bearer {SECRET}'] * 4
  assert [(g.points, g.status) for g in grades] == [
      (5, 'ok'), (6, 'ok'), (None, 'http_error'), (None, 'http_error')]
  assert grades[1].judge_output.count('[redacted]') == 6
  # Scrubbed before the body is cut to the detail's length: no fragment of the key survives.
  assert 'HTTP 403' in grades[2].detail and grades[2].detail.endswith('Bearer [re')
  everything = caplog.text + ''.join(g.detail + g.judge_output for g in grades)
  raw = SECRET.encode()
  for leak in (SECRET, SECRET[:12], SECRET[-12:], repr(SECRET + '\n'),
               base64.b64encode(raw).decode()[:16], base64.b64encode(b'user:' + raw).decode()[8:24],
               base64.urlsafe_b64encode(b'xy' + raw).decode()[4:20]):
    assert leak not in everything, leak
  assert 'invalid (http_error)' in caplog.text


@pytest.mark.parametrize('value', ['', ' \n', 'sk-two\nlines', 'sk-tab\tinside', 'sk-\u00e9'])
def test_unusable_api_key_is_refused_without_printing_it(monkeypatch, value):
  monkeypatch.setenv(KEY_ENV, value)
  with pytest.raises(ValueError, match=KEY_ENV) as e:
    HttpJudge(HttpJudgeSettings('http://127.0.0.1:1/v1', 'm', api_key_env=KEY_ENV))
  assert '\n' not in str(e.value) and (not value.strip() or value.strip() not in str(e.value))


def test_scrubber_finds_base64_at_every_alignment():
  scrub = secrets.Scrubber(SECRET)
  raw = SECRET.encode()
  for lead in range(6):
    for tail in range(3):
      text = base64.b64encode(b'L' * lead + raw + b'T' * tail).decode()
      assert '[redacted]' in scrub(text) and scrub(text).count('[redacted]') == 1
  assert scrub('nothing secret here') == 'nothing secret here'
  assert secrets.Scrubber()('abc') == 'abc'


def test_concurrency_is_bounded(server):
  with HttpJudge(_settings(server, max_concurrency=3)) as judge:
    grades = judge.grade_batch([JudgeRequest('concurrency', 'p')] * 9)
  assert all(g.points == 5 for g in grades)
  assert 1 < server.script.max_in_flight <= 3


def test_closed_judge_returns_invalid_grades_not_exceptions(server):
  judge = HttpJudge(_settings(server))
  judge.close()
  (g,) = judge.grade_batch([JudgeRequest('well', 'p')])
  assert (g.points, g.status) == (None, 'internal_error')


@pytest.mark.parametrize('reply_kwargs', [
    dict(headers=(('Connection', 'close'),)),  # the server says it closes
    dict(drop_connection=True),  # it closes a kept-alive connection without saying so
])
def test_judge_reconnects_when_the_server_closes_connections(reply_kwargs):
  def reply(_):
    return local_server.Reply(200, local_server.completion_body('<points>2</points>'),
                              **reply_kwargs)
  with local_server.LocalChatServer(reply) as srv:
    with HttpJudge(HttpJudgeSettings(srv.base_url, 'm', max_concurrency=1, max_retries=0)) as j:
      grades = [j.grade(JudgeRequest('x', 'p')) for _ in range(5)]
  # No retries allowed, yet every request succeeds: the reconnect is transparent.
  assert [(g.points, g.attempts) for g in grades] == [(2, 1)] * 5


def test_bench_judge_runs_and_reports(capsys):
  from ac2_jax.bench import judge as judge_bench  # pylint: disable=g-import-not-at-top
  judge_bench.main(['--requests', '48', '--concurrency', '8', '--latency_ms', '5',
                    '--serial_requests', '4'])
  out = capsys.readouterr().out
  assert '(48/48 valid)' in out
  assert 'ideal grades/s' in out and 'speed-up x' in out and 'goal >= 200 grades/s' in out
