# local-paths-only: it sweeps and trains in temporary folders it makes.
"""What a sweep adds over its trials: `sweep.py` against the same trials run
as `train.py` commands one after another.

  sweep  python scripts/sweep.py --gin_file=gin/digits.gin
             --sweep_dir=<fresh> --space='optimizer.learning_rate=[0.001,
             0.003, 0.01]' --space='trainer.global_batch_size=[32, 64]'
             --metric=accuracy --direction=maximize --n_trials=6
             --gin_param=trainer.train_steps=<--steps>
  loop   the 6 trials' own commands, `python train.py --gin_file=...
             --gin_param=... --mode=train_and_eval --model_dir=<fresh>`,
             one after another, as a shell loop runs them

The loop is the trials themselves, with nothing of the sweep's: no study,
no checks, no report. The sweep does all of that (its imports, the bad-input
checks with a `train.py --dry_run`, Optuna's journal, HParams, the table,
`results.csv` and the plot), and starts each trial's process ahead, so that
its TensorFlow loads while the trial before trains (`trainer.sweeps.warm`).
`--trials=N` (2, 4 or 6) takes the grid's first N points, learning rate
first: a shorter measurement of the same kind. The two take turns over
`--rounds` rounds, the first of a round alternating; each must exit 0 with
every trial COMPLETE (the sweep) or every run at its last step (the loop). Reported: the median seconds of each, and `added`, the
median over the rounds of (sweep - loop) / loop within a round: negative
where the sweep is faster than running its trials by hand. Also, from the
sweep's own lines, its trials' seconds as it measured them (from the trial's
command to its exit, the loading done ahead left out) and what the sweep
took beyond them.

Target: added <= 0.05 (the sweep adds at most 5% to its trials' own time).

Usage, from the repository root:
  python scripts/benchmark_sweep.py [--rounds=3] [--steps=300] [--trials=6]

The last line printed is `JSON {...}`: `seconds` (medians per contender),
`added`, `target`, `trial_seconds` and `beyond_trials` (medians over the
sweep's rounds), `rounds`, `steps`, `trials`.
"""

import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from trainer.report import usage

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 3, "Rounds (a sweep and a loop each).",
                     lower_bound=1)
flags.DEFINE_integer("steps", 300, "Training steps of each trial.",
                     lower_bound=1)
flags.DEFINE_enum("trials", "6", ["2", "4", "6"], "Trials: the first N "
                  "points of the 3x2 grid, learning rate first.")

RATES = ("0.001", "0.003", "0.01")
BATCHES = ("32", "64")
TARGET = 0.05
_COMPLETE = re.compile(r"^sweep \| trial \d+ COMPLETE \| .* \| ([\d.]+) s \|",
                       re.MULTILINE)


def _points() -> List[Tuple[str, str]]:
  """The (learning rate, batch size) of each trial, in the grid's order."""
  return list(itertools.product(RATES, BATCHES))[:int(FLAGS.trials)]


def _base() -> List[str]:
  return ["--gin_file=gin/digits.gin",
          f"--gin_param=trainer.train_steps={FLAGS.steps}"]


def run_sweep(directory: str) -> Tuple[float, List[float]]:
  """Runs the sweep; returns its seconds and its trials' own seconds."""
  points = _points()
  rates = sorted({rate for rate, _ in points}, key=RATES.index)
  batches = sorted({batch for _, batch in points}, key=BATCHES.index)
  start = time.perf_counter()
  result = subprocess.run(
      [sys.executable, "scripts/sweep.py", *_base(),
       f"--sweep_dir={directory}",
       f"--space=optimizer.learning_rate=[{', '.join(rates)}]",
       f"--space=trainer.global_batch_size=[{', '.join(batches)}]",
       "--metric=accuracy", "--direction=maximize",
       f"--n_trials={len(points)}"],
      cwd=REPO_ROOT, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - start
  trials = [float(s) for s in _COMPLETE.findall(result.stdout)]
  if result.returncode or len(trials) != len(points):
    sys.exit(f"benchmark_sweep.py: the sweep failed (exit "
             f"{result.returncode}):\n{result.stderr[-2000:]}")
  return seconds, trials


def run_loop(directory: str) -> float:
  """Runs the trials' train.py commands one after another; returns the
  seconds."""
  start = time.perf_counter()
  for index, (rate, batch) in enumerate(_points()):
    result = subprocess.run(
        [sys.executable, "train.py", *_base(),
         f"--gin_param=optimizer.learning_rate={rate}",
         f"--gin_param=trainer.global_batch_size={batch}",
         "--mode=train_and_eval",
         f"--model_dir={os.path.join(directory, f'trial-{index}')}"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if (result.returncode or
        f"finished at step {FLAGS.steps}" not in result.stdout):
      sys.exit(f"benchmark_sweep.py: a train.py run failed (exit "
               f"{result.returncode}):\n{result.stderr[-2000:]}")
  return time.perf_counter() - start


def main(argv):
  del argv
  seconds = {"sweep": [], "loop": []}
  trials, added = [], []
  for round_index in range(FLAGS.rounds):
    order = ["sweep", "loop"] if round_index % 2 == 0 else ["loop", "sweep"]
    for name in order:
      with tempfile.TemporaryDirectory(prefix=f"benchmark-{name}-") as d:
        if name == "sweep":
          took, own = run_sweep(os.path.join(d, "sweep"))
          trials.append(sum(own))
        else:
          took = run_loop(d)
      seconds[name].append(took)
    added.append((seconds["sweep"][-1] - seconds["loop"][-1]) /
                 seconds["loop"][-1])
    print(f"round {round_index + 1}: sweep {seconds['sweep'][-1]:.1f} s, "
          f"loop {seconds['loop'][-1]:.1f} s, added {added[-1]:+.3f}; the "
          f"sweep's trials {trials[-1]:.1f} s by its own count", flush=True)
  medians = {name: round(statistics.median(v), 2)
             for name, v in seconds.items()}
  result = {"seconds": medians, "added": round(statistics.median(added), 3),
            "target": TARGET,
            "trial_seconds": round(statistics.median(trials), 2),
            "beyond_trials": round(statistics.median(
                s - t for s, t in zip(seconds["sweep"], trials)), 2),
            "rounds": FLAGS.rounds, "steps": FLAGS.steps,
            "trials": int(FLAGS.trials)}
  print(f"sweep {medians['sweep']:.1f} s, its {FLAGS.trials} trials as "
        f"train.py commands {medians['loop']:.1f} s: the sweep adds {result['added']:+.1%} "
        f"(target <= {TARGET:.0%}): "
        f"{'MET' if result['added'] <= TARGET else 'NOT MET'}")
  print("JSON " + json.dumps(result))


if __name__ == "__main__":
  usage.exit_if_requested(sys.argv, __doc__)
  app.run(main)
