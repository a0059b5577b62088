"""Proof data sets from local files (tfds builders, array_record) and the proof task."""

import dataclasses
import pathlib
import shutil
import sys

import pytest

from ac2_jax import tokenization
from ac2_jax.critic import prompt as critic_prompt
from ac2_jax.judges import local_server
from ac2_jax.judges.http import HttpJudge, HttpJudgeSettings
from ac2_jax.tasks import base
from ac2_jax.tasks import proofs
from ac2_jax.tasks import proofs_tfds as pt

FIXTURES = pathlib.Path(__file__).parent / 'fixtures' / 'proofs'
SHARED_PROBLEM = r'Prove that for every integer $n \ge 1$, $n^3 - n$ is divisible by $6$.'


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('tfds')


@pytest.fixture(scope='module')
def train_rows(data_dir):
  return pt.read_rows(pt.prepare('fineproofs_rl', FIXTURES / 'fineproofs_rl', data_dir))


@pytest.fixture(scope='module')
def validation_rows(data_dir):
  return pt.read_rows(pt.prepare('imo_proofbench', FIXTURES / 'imo_proofbench', data_dir))


# ------------------------------------------------------------------------------ builders

def test_fineproofs_builder_reads_parquet_into_array_record(data_dir, train_rows):
  assert len(train_rows) == 4
  first = train_rows[0]
  assert first.problem == r'Prove that $\sqrt{2}$ is irrational.'
  assert first.source == 'aops' and first.guidelines.startswith('1 pt')
  assert first.reference_solution == ''
  assert (first.file, first.row) == ('data/train-00000-of-00001.parquet', 1)
  assert [r.row for r in train_rows] == [1, 2, 3, 4]
  assert len({r.id for r in train_rows}) == 4 and all(r.id.startswith('p-') for r in train_rows)
  shards = list(pathlib.Path(data_dir).glob('fineproofs_rl/*/1.0.0/*.array_record-*'))
  assert shards, 'the prepared copy is array_record files'
  assert 'tensorflow' not in sys.modules


def test_jsonl_copy_gives_the_same_rows(data_dir, train_rows):
  rows = pt.read_rows(pt.prepare('fineproofs_rl', FIXTURES / 'fineproofs_rl_jsonl', data_dir))
  key = lambda r: (r.id, r.problem, r.guidelines, r.source)  # noqa: E731
  assert [key(r) for r in rows] == [key(r) for r in train_rows]
  assert [(r.file, r.row) for r in rows] == [('train.jsonl', i) for i in (1, 2, 3, 4)]


def test_imo_proofbench_builder_parquet_and_csv(data_dir, validation_rows):
  assert [r.id for r in validation_rows] == ['PB-Basic-001', 'PB-Basic-002', 'PB-Advanced-001']
  first = validation_rows[0]
  assert first.problem == SHARED_PROBLEM
  assert first.reference_solution.startswith('$n^3 - n = (n-1)n(n+1)$')
  assert first.guidelines.startswith('(Partial) 3 points')
  assert first.source == 'Novel Problem'
  csv_rows = pt.read_rows(pt.prepare('imo_proofbench', FIXTURES / 'imo_proofbench_csv', data_dir))
  strip = lambda r: dataclasses.replace(r, file='', row=0)  # noqa: E731
  assert [strip(r) for r in csv_rows] == [strip(r) for r in validation_rows]


def test_prepare_reuses_a_matching_copy_and_rebuilds_after_a_change(tmp_path, data_dir):
  manual = tmp_path / 'manual'
  shutil.copytree(FIXTURES / 'fineproofs_rl_jsonl', manual)
  b1 = pt.prepare('fineproofs_rl', manual, data_dir)
  b2 = pt.prepare('fineproofs_rl', manual, data_dir)
  assert b1.data_dir == b2.data_dir
  with open(manual / 'train.jsonl', 'a', encoding='utf-8') as f:
    f.write('{"problem": "Prove that 1 + 1 = 2.", "source": "aops", "rubrics": "7 pts"}\n')
  b3 = pt.prepare('fineproofs_rl', manual, data_dir)
  assert b3.data_dir != b1.data_dir
  assert len(pt.read_rows(b3)) == 5


def test_malformed_jsonl_fatal_names_file_and_row(data_dir):
  with pytest.raises(pt.MalformedRowError) as e:
    pt.prepare('fineproofs_rl', FIXTURES / 'malformed' / 'jsonl', data_dir)
  assert e.value.row == 3 and e.value.file.endswith('malformed/jsonl/train.jsonl')
  assert 'train.jsonl: row 3: invalid JSON' in str(e.value)


def test_malformed_jsonl_skipped_counted_and_warned(data_dir, caplog):
  settings = dataclasses.replace(pt.FINEPROOFS_RL, skip_malformed=True)
  builder = pt.prepare('fineproofs_rl', FIXTURES / 'malformed' / 'jsonl', data_dir, settings)
  rows = pt.read_rows(builder)
  assert [r.row for r in rows] == [1, 6]
  assert pt.num_skipped_rows(builder) == 6
  listed = builder.info.metadata['skipped_rows']
  assert [int(s.split(': row ')[1].split(':')[0]) for s in listed] == [3, 4, 5, 7, 8, 9]
  for fragment in ('invalid JSON', "no column 'problem'", 'is null', 'duplicate id',
                   'not an object', 'holds a float'):
    assert any(fragment in s for s in listed), fragment
  assert 'row 7: duplicate id' in caplog.text and 'skipped 6 malformed rows' in caplog.text


def test_malformed_parquet_rows(data_dir):
  manual = FIXTURES / 'malformed' / 'parquet'
  with pytest.raises(pt.MalformedRowError,
                     match=r'train\.parquet: row 2: column .problem. is null'):
    pt.prepare('fineproofs_rl', manual, data_dir)
  settings = dataclasses.replace(pt.FINEPROOFS_RL, skip_malformed=True)
  rows, skipped = pt.read_source_files(manual, settings)
  assert [r.row for r in rows] == [1]
  assert [(s.row, s.reason) for s in skipped] == [
      (2, "column 'problem' is null"), (3, "column 'problem' is empty")]


# A good row, and one bad file per kind of trouble (written here, read by the real builder).
_GOOD = '{"problem": "Prove that 2 + 2 = 4.", "source": "aops", "rubrics": "7 pts"}\n'


def _write_bad_file(manual: pathlib.Path, kind: str) -> tuple[str, str]:
  """Writes one bad file next to a good one; returns (its name, what the error must say)."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  manual.mkdir(parents=True, exist_ok=True)
  (manual / 'good.jsonl').write_text(_GOOD, encoding='utf-8')
  header = 'problem,source,rubrics\n'
  if kind == 'empty_jsonl':
    (manual / 'bad.jsonl').write_bytes(b'\n  \n')
    return 'bad.jsonl', 'bad.jsonl: empty file: no rows'
  if kind == 'zero_byte_parquet':
    (manual / 'bad.parquet').write_bytes(b'')
    return 'bad.parquet', 'bad.parquet: empty file (0 bytes)'
  if kind == 'empty_parquet':
    pq.write_table(pa.table({'problem': pa.array([], pa.string()),
                             'source': pa.array([], pa.string()),
                             'rubrics': pa.array([], pa.string())}), manual / 'bad.parquet')
    return 'bad.parquet', 'bad.parquet: empty file: no rows'
  if kind == 'corrupt_parquet':
    (manual / 'bad.parquet').write_bytes(b'PAR1 this is not really parquet')
    return 'bad.parquet', 'bad.parquet: not a readable parquet file'
  if kind == 'header_only_csv':
    (manual / 'bad.csv').write_text(header, encoding='utf-8')
    return 'bad.csv', 'bad.csv: empty file: no rows'
  if kind == 'zero_byte_csv':
    (manual / 'bad.csv').write_bytes(b'')
    return 'bad.csv', 'bad.csv: empty file: no rows'
  if kind == 'latin1_jsonl':
    (manual / 'bad.jsonl').write_bytes(
        _GOOD.replace('2 + 2', '3 + 3').encode()
        + '{"problem": "Prove caf\xe9."}\n'.encode('latin-1'))
    return 'bad.jsonl', 'bad.jsonl: row 2: not valid UTF-8 (byte 0xe9'
  if kind == 'latin1_csv':
    (manual / 'bad.csv').write_bytes(
        (header + 'Prove 1 < 2.,aops,7 pts\n').encode() + 'Caf\xe9?,aops,7\n'.encode('latin-1'))
    return 'bad.csv', "bad.csv: row 2: column 'problem' is not valid UTF-8"
  if kind == 'huge_csv_cell':
    (manual / 'bad.csv').write_text(
        header + 'Prove 1 < 2.,aops,7 pts\n' + f'Prove 0 < 1.,aops,"{"x" * 200_000}"\n'
        + 'Prove 2 < 3.,aops,7 pts\n', encoding='utf-8')
    return 'bad.csv', "bad.csv: row 2: column 'rubrics' holds 200,000 characters, more than"
  if kind == 'huge_jsonl_prompt':
    (manual / 'bad.jsonl').write_text(
        '{"problem": "Prove %s.", "rubrics": "7", "source": ""}\n' % ('y' * 6_000_000),
        encoding='utf-8')
    return 'bad.jsonl', "bad.jsonl: row 1: column 'problem' holds 6,000,007 characters"
  raise AssertionError(kind)


_BAD_KINDS = ['empty_jsonl', 'zero_byte_parquet', 'empty_parquet', 'corrupt_parquet',
              'header_only_csv', 'zero_byte_csv', 'latin1_jsonl', 'latin1_csv', 'huge_csv_cell',
              'huge_jsonl_prompt']


@pytest.mark.parametrize('kind', _BAD_KINDS)
def test_bad_data_file_fatal_in_one_line_naming_file_and_row(tmp_path, data_dir, kind):
  manual = tmp_path / 'manual'
  name, message = _write_bad_file(manual, kind)
  with pytest.raises(pt.MalformedRowError) as e:
    pt.prepare('fineproofs_rl', manual, data_dir)
  text = str(e.value)
  assert '\n' not in text and len(text) < 400, text
  assert text.startswith(str(manual / name) + ':'), text
  assert message in text, text


@pytest.mark.parametrize('kind', _BAD_KINDS)
def test_bad_data_file_skipped_and_counted(tmp_path, data_dir, kind, caplog):
  manual = tmp_path / 'manual'
  name, message = _write_bad_file(manual, kind)
  settings = dataclasses.replace(pt.FINEPROOFS_RL, skip_malformed=True)
  builder = pt.prepare('fineproofs_rl', manual, data_dir, settings)
  rows = pt.read_rows(builder)
  assert pt.num_skipped_rows(builder) == 1
  (listed,) = builder.info.metadata['skipped_rows']
  assert message in listed and len(listed) < 400
  # Every good row survives, the ones next to a bad row of the same file included.
  good = {'latin1_jsonl': 2, 'latin1_csv': 2, 'huge_csv_cell': 3}.get(kind, 1)
  assert len(rows) == good and 'good.jsonl' in {r.file for r in rows}
  assert 'skipped 1 malformed rows' in caplog.text


def test_max_field_chars_is_a_setting():
  manual = FIXTURES / 'fineproofs_rl_jsonl'
  rows, _ = pt.read_source_files(manual, pt.FINEPROOFS_RL)
  longest = max(len(r.guidelines) for r in rows)
  tight = dataclasses.replace(pt.FINEPROOFS_RL, skip_malformed=True, max_field_chars=longest - 1)
  kept, skipped = pt.read_source_files(manual, tight)
  assert len(kept) + len(skipped) == len(rows) and skipped
  assert all('more than max_field_chars=' in s.reason for s in skipped)
  assert pt.DEFAULT_MAX_FIELD_CHARS == 100_000
  with pytest.raises(ValueError, match='max_field_chars must be >= 1'):
    pt.ProofSourceSettings(max_field_chars=0)


def test_validation_rows_need_reference_and_guidelines():
  manual = FIXTURES / 'malformed' / 'validation'
  with pytest.raises(pt.MalformedRowError, match=r"row 2: column 'Solution' is empty"):
    pt.read_source_files(manual, pt.IMO_PROOFBENCH)
  rows, skipped = pt.read_source_files(
      manual, dataclasses.replace(pt.IMO_PROOFBENCH, skip_malformed=True))
  assert [r.id for r in rows] == ['PB-Basic-001', 'PB-Advanced-001'] and len(skipped) == 1


def test_configurable_columns_and_missing_column_error():
  # IMO-ProofBench files read as training data under their own column names.
  settings = pt.ProofSourceSettings(columns=pt.ProofColumns(problem='Problem', id='Problem ID',
                                                            source='Category'))
  rows, _ = pt.read_source_files(FIXTURES / 'imo_proofbench', settings)
  assert [(r.id, r.source) for r in rows][:2] == [('PB-Basic-001', 'Number theory'),
                                                  ('PB-Basic-002', 'Algebra')]
  # A column the parquet file lacks is a settings error, fatal even when skipping rows.
  bad = pt.ProofSourceSettings(columns=pt.ProofColumns(problem='statement'), skip_malformed=True)
  with pytest.raises(ValueError, match=r"no column\(s\) \['statement'\].*the file has"):
    pt.read_source_files(FIXTURES / 'fineproofs_rl', bad)


def test_prepare_argument_errors(tmp_path, data_dir):
  with pytest.raises(ValueError, match='unknown proof data set'):
    pt.prepare('gsm8k', FIXTURES / 'fineproofs_rl', data_dir)
  with pytest.raises(FileNotFoundError, match='does not exist'):
    pt.prepare('fineproofs_rl', tmp_path / 'nowhere', data_dir)
  (tmp_path / 'empty').mkdir()
  (tmp_path / 'empty' / 'notes.txt').write_text('x')
  with pytest.raises(FileNotFoundError, match='no files matching'):
    pt.prepare('fineproofs_rl', tmp_path / 'empty', data_dir)


# ------------------------------------------------------------------------------ the proof task

@pytest.fixture(scope='module')
def tok(tmp_path_factory):
  corpus = ['Prove that the square root of two is irrational. <proof> We assume </proof>'] * 20
  return tokenization.SentencePieceTokenizer.train(
      corpus, str(tmp_path_factory.mktemp('sp') / 'sp'), vocab_size=300)


class Grader:
  """Server behaviour: 7 points when the validation sections arrived, else 3; counts calls."""

  def __init__(self):
    self.proofs = []

  def __call__(self, req):
    user = req.body['messages'][1]['content']
    self.proofs.append(user.split('<proof>\n', 1)[1].split('\n</proof>', 1)[0])
    validation = '<reference_solution>' in user and '<grading_guidelines>' in user
    return local_server.Reply(200, local_server.completion_body(
        '<points>7 out of 7</points>' if validation else '<points>3 out of 7</points>'))


def _judge(srv, mode):
  return HttpJudge(HttpJudgeSettings(srv.base_url, 'judge', mode=mode, max_retries=0))


def test_task_splits_prompts_and_decontamination(train_rows, validation_rows, tok):
  task = proofs.ProofTask(train_rows, validation_rows, train_judge=None)
  assert isinstance(task, base.Task)
  train, val = task.records('train'), task.records('validation')
  assert len(train) == 3 and len(val) == 3 and task.num_dropped_overlaps == 1
  assert SHARED_PROBLEM not in [r.prompt.split('\n\n')[0] for r in train]
  assert {r.id for r in train}.isdisjoint({r.id for r in val})
  assert all(r.split == 'train' for r in train) and all(r.split == 'validation' for r in val)
  assert val[0].reference_solution and val[0].guidelines
  assert train[0].prompt.startswith(r'Prove that $\sqrt{2}$ is irrational.')
  assert '<proof>' in train[0].prompt and '</proof>' in train[0].prompt
  with pytest.raises(ValueError, match='unknown split'):
    task.records('test')
  ids = task.prompt_ids(tok, train[0])
  text = tok.decode(ids)
  assert text.startswith('<|im_start|>user\n' + train[0].prompt)
  assert text.endswith('<|im_start|>assistant\n<think>\n')


@pytest.mark.parametrize('response, proof', [
    ('think...</think>\n\n<proof>Since 2 = 1 + 1.</proof>', 'Since 2 = 1 + 1.'),
    ('t</think><proof>\n first </proof> then <proof>second</proof>', 'first'),
    ('still thinking <proof>draft</proof>', None),  # thinking section never closed
    ('<proof>draft</proof> more thought </think> answer without block', None),
    ('t</think><proof>unfinished', None),
    ('t</think><proof>  \n </proof>', None),  # empty proof is no answer
    ('', None),
])
def test_complete_answer_rule(response, proof):
  task = proofs.ProofTask([], [], train_judge=None)
  assert proofs.extract_proof(response) == proof
  assert task.has_complete_answer(response) is (proof is not None)
  assert task.reference_from_response(response) == proof


def test_critic_instruction_is_the_papers():
  task = proofs.ProofTask([], [], train_judge=None)
  assert task.critic_instruction(None) == critic_prompt.PROOF_INSTRUCTION
  with_ref = task.critic_instruction('REF PROOF {x}')
  assert 'You should refer to a reference correct proof here:\nREF PROOF {x}' in with_ref


def test_score_batch_routes_to_the_judges(train_rows, validation_rows):
  grader = Grader()
  with local_server.LocalChatServer(grader) as srv, _judge(srv, 'training') as tj, \
      _judge(srv, 'validation') as vj:
    task = proofs.ProofTask(train_rows, validation_rows, train_judge=tj, validation_judge=vj)
    train, val = task.records('train'), task.records('validation')
    stranger = base.ProblemRecord(id='nope', split='train', prompt='x')
    records = [train[0], train[1], val[0], val[1], stranger]
    responses = ['a</think><proof>P1</proof>', 'no block at all </think> sorry',
                 'b</think><proof>V1</proof>', 'c</think><proof>V2</proof>',
                 'd</think><proof>X</proof>']
    grades = task.score_batch(records, responses)
  assert [(g.points, g.status) for g in grades] == [
      (3, 'ok'), (0, 'no_answer'), (7, 'ok'), (7, 'ok'), (None, 'internal_error')]
  assert 'unknown problem id' in grades[4].detail
  assert sorted(grader.proofs) == ['P1', 'V1', 'V2']  # no request for the missing proof
  with pytest.raises(ValueError, match='2 records but 1 responses'):
    task.score_batch(records[:2], responses[:1])


def test_score_batch_never_raises_on_judge_trouble(train_rows, validation_rows):
  class BrokenJudge:
    def grade_batch(self, requests):
      raise RuntimeError('judge process died')

  class ShortJudge:
    def grade_batch(self, requests):
      return []

  task = proofs.ProofTask(train_rows, validation_rows, train_judge=BrokenJudge(),
                          validation_judge=None)
  rec_t, rec_v = task.records('train')[0], task.records('validation')[0]
  g_t, g_v = task.score_batch([rec_t, rec_v], ['x</think><proof>p</proof>'] * 2)
  assert (g_t.status, g_v.status) == ('internal_error', 'internal_error')
  assert 'RuntimeError' in g_t.detail and 'no judge configured' in g_v.detail
  task = proofs.ProofTask(train_rows, validation_rows, train_judge=ShortJudge())
  (g,) = task.score_batch([rec_t], ['x</think><proof>p</proof>'])
  assert g.status == 'internal_error' and '0 grades for 1 requests' in g.detail


def test_task_rejects_bad_construction(train_rows):
  with pytest.raises(ValueError, match='exactly once'):
    proofs.ProofTask([], [], train_judge=None, prompt_template='no slot')
  with pytest.raises(ValueError, match='occurs in both splits or twice'):
    proofs.ProofTask(train_rows[:1], [dataclasses.replace(train_rows[0], problem='other')],
                     train_judge=None)


def test_make_proof_task_from_files(data_dir):
  settings = proofs.ProofDataSettings(
      train_manual_dir=str(FIXTURES / 'fineproofs_rl_jsonl'),
      validation_manual_dir=str(FIXTURES / 'imo_proofbench_csv'), data_dir=str(data_dir))
  task = proofs.make_proof_task(settings, train_judge=None)
  assert len(task.records('train')) == 3 and len(task.records('validation')) == 3


def test_prompts_over_the_context_limit_rejected_or_skipped_and_counted(tmp_path, data_dir, tok,
                                                                          caplog):
  manual = tmp_path / 'train'
  shutil.copytree(FIXTURES / 'fineproofs_rl_jsonl', manual)
  with open(manual / 'train.jsonl', 'a', encoding='utf-8') as f:
    f.write('{"problem": "Prove that %s is long.", "source": "x", "rubrics": "7"}\n'
            % ('the square root of two ' * 400))
  settings = proofs.ProofDataSettings(
      train_manual_dir=str(manual), validation_manual_dir=str(FIXTURES / 'imo_proofbench_csv'),
      data_dir=str(data_dir), max_prompt_tokens=1000)
  with pytest.raises(pt.MalformedRowError) as e:
    proofs.make_proof_task(settings, train_judge=None, tokenizer=tok)
  text = str(e.value)
  assert '\n' not in text and text.startswith('train.jsonl: row 5: prompt is '), text
  assert 'tokens long, more than max_prompt_tokens=1,000 (the context limit; train split)' in text
  skipping = dataclasses.replace(
      settings, train=dataclasses.replace(pt.FINEPROOFS_RL, skip_malformed=True))
  task = proofs.make_proof_task(skipping, train_judge=None, tokenizer=tok)
  assert task.num_long_prompts == {'train': 1, 'validation': 0}
  assert len(task.records('train')) == 3 and len(task.records('validation')) == 3
  assert max(len(task.prompt_ids(tok, r)) for r in task.records('train')) <= 1000
  assert 'skipped 1 train prompts longer than max_prompt_tokens=1000' in caplog.text
  # Without a tokenizer (or with limit 0) there is no check.
  assert len(proofs.make_proof_task(settings, train_judge=None).records('train')) == 4
  unlimited = dataclasses.replace(settings, max_prompt_tokens=0)
  assert len(proofs.make_proof_task(unlimited, train_judge=None, tokenizer=tok)
             .records('train')) == 4
  with pytest.raises(ValueError, match='max_prompt_tokens must be >= 0'):
    proofs.ProofTask([], [], train_judge=None, max_prompt_tokens=-1)
