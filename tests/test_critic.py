"""Critic value grid, reply parsing, and the token-level critic prompt (SentencePiece made here)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax import critic, tokenization
from ac2_jax.critic import prompt as critic_prompt
from ac2_jax.critic import values

_CORPUS = [
    'Prove that the sum of two even numbers is even.',
    'Let a = 2m and b = 2n. Then a + b = 2(m + n), which is even.',
    'Pause here and estimate how much rubric credit this attempt will earn. Q value: 0.3',
    'You should refer to a reference correct proof here.',
    'system\nuser\nassistant\n',
] * 10


@pytest.fixture(scope='module')
def tok(tmp_path_factory):
  return tokenization.SentencePieceTokenizer.train(
      iter(_CORPUS), str(tmp_path_factory.mktemp('sp') / 'critic'), 300,
      user_defined_symbols=['Q value:'])


def test_round_to_grid_hand_numbers_and_ties_down():
  cases = {0.0: 0.0, 0.04: 0.0, 0.05: 0.0, 0.051: 0.1, 0.25: 0.2, 0.26: 0.3, 0.35: 0.3, 0.45: 0.4,
           0.95: 0.9, 0.96: 1.0, 1.0: 1.0, -0.3: 0.0, 1.7: 1.0, 0.15000000000000002: 0.1,
           2 / 3: 0.7}
  for x, expected in cases.items():
    assert critic.round_to_grid(x) == expected, x
  # A group mean that is a tie only up to float error: mean of [0.1, 0.2] is 0.15000000000000002.
  assert critic.round_to_grid(np.mean([0.1, 0.2])) == 0.1
  xs = np.linspace(-0.2, 1.2, 1401)
  np.testing.assert_allclose(jax.jit(lambda x: critic.round_to_grid_array(x, jnp))(xs),
                             [critic.round_to_grid(x) for x in xs], atol=1e-7)
  with pytest.raises(ValueError, match='finite'):
    critic.round_to_grid(float('nan'))


def test_two_hot_hand_numbers_and_its_mean_is_the_target():
  cases = {0.44: (0.4, 0.5, 0.4), 0.4: (0.4, 0.4, 0.0), 0.95: (0.9, 1.0, 0.5), 1.0: (1.0, 1.0, 0.0),
           0.0: (0.0, 0.0, 0.0), 0.03: (0.0, 0.1, 0.3), -0.2: (0.0, 0.0, 0.0), 1.3: (1.0, 1.0, 0.0),
           0.3999999: (0.4, 0.4, 0.0)}  # the last: a group mean on the grid up to float error
  for x, (low, high, w) in cases.items():
    got = critic.two_hot(x)
    assert got[:2] == (low, high) and got[2] == pytest.approx(w, abs=1e-6), x
  for x in np.linspace(0, 1, 97):
    low, high, w = critic.two_hot(x)
    assert 0 <= w < 1 and high - low in (0.0, pytest.approx(0.1))
    assert (1 - w) * low + w * high == pytest.approx(x, abs=2e-5)
  with pytest.raises(ValueError, match='finite'):
    critic.two_hot(float('inf'))


def test_parse_value():
  cases = {'0.7': 0.7, ' .7 and more': 0.7, '1.00': 1.0, '0': 0.0, '1': 1.0, '0.50<|im_end|>': 0.5,
           '\n0.3': 0.3, '0.25': None, '0.333': None, 'Q value: 0.7': None, '': None, 'abc': None,
           '-0.1': None, '.': None}
  for text, expected in cases.items():
    assert critic.parse_value(text) == expected, text
  # The spec regex alone reads '1.5' as 1; a number that runs on past the match is invalid
  # (ALGORITHMS.md item 8), while text after a complete number is still ignored.
  for text in ('1.5', '1.05', '0.55', '10', '1.0001', '01', '1.5<|im_end|>', ' 1.05 ', '.75'):
    assert critic.parse_value(text) is None, text
  for text, expected in {'1.': 1.0, '0.7.': 0.7, '1 point': 1.0, '0.3, since': 0.3,
                         '1.0<|im_end|>': 1.0, '0.4\n': 0.4}.items():
    assert critic.parse_value(text) == expected, text
  with pytest.raises(TypeError, match='str'):
    critic.parse_value(0.5)


def test_format_value_round_trips_every_grid_value():
  expected = ['0'] + [f'0.{i}' for i in range(1, 10)] + ['1']
  assert [values.format_value(v) for v in critic.GRID] == expected
  for v in critic.GRID:
    assert critic.parse_value(values.format_value(v)) == v
  with pytest.raises(ValueError, match='not on the grid'):
    values.format_value(0.25)


def test_critic_context_without_reference(tok):
  prompt_ids = tokenization.render_chat(tok,
                                        [tokenization.Turn('user', 'Prove that 2 + 2 is even.')])
  response_ids = tok.encode('Let a = 2m.')
  ids = critic.critic_context_ids(tok, prompt_ids, response_ids)
  assert ids[:len(prompt_ids) + len(response_ids)] == prompt_ids + response_ids
  expected = (tok.decode(prompt_ids) + 'Let a = 2m.' + '</think>' + '<|im_end|>\n'
              + '<|im_start|>user\n' + critic_prompt.PROOF_INSTRUCTION + '<|im_end|>\n'
              + '<|im_start|>assistant\n<think>\n\n</think>\n\nQ value: ')
  assert tok.decode(ids) == expected
  assert ids[len(prompt_ids) + len(response_ids)] == tok.token_id('</think>')
  # A finished response keeps a single <|im_end|>.
  finished = critic.critic_context_ids(tok, prompt_ids, response_ids + [tok.eos_id])
  assert finished == ids


def test_critic_context_keeps_an_existing_think_close_and_quotes_the_reference(tok):
  prompt_ids = tokenization.render_chat(tok, [tokenization.Turn('user', 'Prove it.')])
  response_ids = tok.encode('done thinking\n</think>\n\nProof: trivial')
  reference = 'Let $a = 2m$ and $b = 2n$; then {a + b} = 2(m + n).'
  ids = critic.critic_context_ids(tok, prompt_ids, response_ids, reference=reference)
  text = tok.decode(ids)
  # The response's own </think>, and the prefill's empty thinking section.
  assert text.count('</think>') == 2
  assert ('Proof: trivial<|im_end|>\n<|im_start|>user\nPause here' in text)
  assert 'You should refer to a reference correct proof here:\n' + reference + '\n\n' in text
  assert text.endswith('<|im_start|>assistant\n<think>\n\n</think>\n\nQ value: ')


def test_custom_instructions_and_their_validation(tok):
  instructions = critic.CriticInstructions(plain='Rate it.',
                                           with_reference='Rate it against {reference}.')
  ids = critic.critic_context_ids(tok, [], [], reference='R', instructions=instructions)
  assert '<|im_start|>user\nRate it against R.<|im_end|>' in tok.decode(ids)
  assert critic.critic_context_ids(tok, [], [], instruction_text='Rate it against R.') == ids
  with pytest.raises(ValueError, match='not both'):
    critic.critic_context_ids(tok, [], [], reference='R', instruction_text='x')
  with pytest.raises(ValueError, match='exactly once'):
    critic.CriticInstructions(with_reference='no slot')
  with pytest.raises(ValueError, match='plain'):
    critic.CriticInstructions(plain='has {reference}')
  assert '{reference}' in critic_prompt.PROOF_INSTRUCTION_WITH_REFERENCE
  instruction = critic_prompt.PROOF_INSTRUCTION
  assert instruction.startswith('Pause here and estimate how much rubric credit')
  assert instruction.endswith('The first characters of your response must be `Q value:`.')


def test_value_target_ids(tok):
  ids = critic.value_target_ids(tok, 0.7)
  assert ids[-1] == tok.eos_id
  assert tok.decode(ids) == '0.7<|im_end|>'
  assert tok.decode(critic.value_target_ids(tok, 1.0)) == '1<|im_end|>'
  with pytest.raises(ValueError, match='grid'):
    critic.value_target_ids(tok, 0.75)


def test_two_hot_target_ids_need_one_token_grid_values(tok):
  # This SentencePiece model writes '0.7' in several pieces: a two-hot target cannot be one token.
  assert len(critic.value_target_ids(tok, 0.7)) > 2
  with pytest.raises(ValueError, match='one token.*critic.target=rounded'):
    critic.two_hot_target_ids(tok, 0.74)


def test_a_rationale_goes_before_the_answer_stem(tok):
  prompt_ids = tokenization.render_chat(tok, [tokenization.Turn('user', 'Prove it.')])
  context = critic.critic_context_ids(tok, prompt_ids, tok.encode('Let a = 2m.'))
  rationale = tok.encode('a b\n')
  ids, start = critic.with_rationale(tok, context, rationale)
  assert tok.decode(ids).endswith('<think>\n\n</think>\n\na b\nQ value: ')
  assert ids[start:start + len(rationale)] == rationale
  assert ids[:start] + ids[start + len(rationale):] == context
  with pytest.raises(ValueError, match='answer stem'):
    critic.with_rationale(tok, context[:-1], rationale)


def test_verdict_rationales(tok):
  ids, offsets = critic.verdict_rationale(tok, [True, False, True])
  assert tok.decode(ids) == 'yny\n' and offsets == [0, 1, 2]
  assert critic.verdict_rationale(tok, []) == (tok.encode('\n'), [])
  # Each line repeated before its verdict: the verdicts sit right after their lines.
  ids, offsets = critic.verdict_rationale(tok, [True, False], ['a = 2m', 'b'])
  assert tok.decode(ids) == 'a = 2my\nbn\n'
  assert [tok.decode([ids[o]]) for o in offsets] == ['y', 'n']
  assert offsets == [len(tok.encode('a = 2m')), len(tok.encode('a = 2m')) + 2 + len(tok.encode('b'))]
