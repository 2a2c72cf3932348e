"""Sweeps gin bindings on Optuna: one train.py process per trial.

Usage:
  python scripts/sweep.py --gin_file=gin/digits.gin --sweep_dir=runs/sweep \\
      --space='optimizer.learning_rate=[0.001, 0.003, 0.01]' \\
      --space='trainer.global_batch_size=[32, 64]' \\
      --metric=accuracy --direction=maximize --n_trials=6 [--sampler=grid]
      [--pruner=median] [--parallel=2] [--storage=sqlite:///sweep.db]

`--space` takes a list (`[a, b]`), `loguniform(a, b)`, `uniform(a, b)` or
`int(a, b)`. Each trial is `train.py` in `SWEEP_DIR/trial-<n>` with the
trial's bindings as `--gin_param`s. The study is Optuna's journal file in
`--sweep_dir` (or `--storage`): rerunning the same command continues it, a
trial a dead process left resumes from its checkpoint, and more processes
on the same `--sweep_dir` join as workers. `--report` prints the table of
a sweep and writes its results.csv. A URL `--sweep_dir` (`gs://...`) holds
the trials and results, and a copy of the journal, which is kept on the
sweeping machine (Optuna's journal needs a local file system): one process
sweeps it, and a rerun on any machine continues from the copy.

Exit codes: 0 done, 1 the first trials all failed, a trial was killed by a
signal, or the disk is full or read-only (one line; rerun to continue),
2 bad input (one line, before any trial starts), 42 stopped by a signal
(rerun to resume).
"""

import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))  # local-path: the repository's own file

# pylint: disable=wrong-import-position
from trainer.sweeps import warm  # noqa: E402  The standard library only.

# The dry run's and the first trial's processes load TensorFlow while this
# process loads its own.
AHEAD = warm.start(sys.argv) if __name__ == "__main__" else None

import trainer  # noqa: E402,F401  Selects Keras 2 before TensorFlow loads.

if importlib.util.find_spec("optuna") is None:
  print("sweep.py: error: optuna is not installed: pip install -e "
        "'.[sweep]' (see docs/sweeps.md)", file=sys.stderr)
  sys.exit(2)
from trainer.sweeps import cli  # noqa: E402

if __name__ == "__main__":
  cli.main(AHEAD)
