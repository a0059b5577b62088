"""Plots a finished (or running) workdir: python launch/plot.py WORKDIR [OUT_DIR]"""

import sys

from ac2_jax.train import plots

if __name__ == '__main__':
  if len(sys.argv) not in (2, 3):
    raise SystemExit(__doc__)
  for path in plots.plot_run(*sys.argv[1:]):
    print(path)
