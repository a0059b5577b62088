"""The controller benchmark runs end to end at paper size and reports its timings."""

from ac2_jax.bench import controller as bench


def test_bench_runs_a_paper_sized_step(capsys):
  bench.main(['--steps', '1', '--problems', '1000'])
  out = capsys.readouterr().out
  assert 'replay buffer 256/256, critic buffer 1920/1920' in out
  assert "'refill': 192" in out and 'plan+observe  median' in out
