"""What does a training mixture cost? Its step time against one source's.

For a task's gin configuration with a mixture (the files and bindings
`train.py` takes, e.g. the shipped gin/digits_mixture.gin), in one process,
it builds two trainings of the same model, batch and optimizer, each as
`train.py` builds it (our controller and runner, train summaries every
`trainer.summary_interval` steps into a temporary directory, no
checkpoints):

  mixture      the sources mixed at the configured rates: the sampler, each
               example's source index carried and stripped, the train
               summaries' per-source shares and losses;
  one source   the Task's first source alone (the one it returns first),
               batched as one dataset is, without a mixture.

Each round times `--steps` steps of one training, then of the other (the
order alternates between rounds), after a warm-up that traces both loops:
tracing, building the pipelines and the first batches are not step time.
The ratio is the median over the rounds of the two step times' ratio within
a round, so a slow spell on a shared host slows both sides of a ratio
instead of one. Target: the mixture's step at most 1.05x one source's.

Usage, from the repository root:
  python scripts/benchmark_mixture.py gin/digits_mixture.gin
      [--gin_param=...] [--steps=500] [--rounds=9]

The last line is `JSON {...}` with the figures.
"""

# local-paths-only: its summaries go to a temporary folder it makes, its
# output to os.devnull; nothing else but this repository

import contextlib
import copy
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402  Selects Keras 2 before TensorFlow loads.
from absl import flags

from trainer import build
from trainer import cli
from trainer import console
from trainer import errors
from trainer.loop.control import controller as controller_lib

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 500, "Timed steps of each training per round.",
                     lower_bound=10)
flags.DEFINE_integer("rounds", 9, "Rounds, each timing both trainings.",
                     lower_bound=1)

TARGET = 1.05  # The mixture's step time over one source's.
CONTENDERS = ("mixture", "one source")


def one_source(task: trainer.Task) -> trainer.Task:
  """Returns a copy of `task` whose training input is its first source
  alone, with no rates of its own.

  A copy whose class adds only these two hooks: every other hook, and the
  instance's configuration, are the task's.
  """
  base = type(task)

  class OneSource(base):  # pylint: disable=missing-class-docstring

    def build_inputs(self, training, input_context=None):
      built = base.build_inputs(self, training, input_context)
      if training and isinstance(built, dict):
        return next(iter(built.values()))
      return built

    def mixture_rates(self):
      return None

  alone = copy.copy(task)
  alone.__class__ = OneSource
  return alone


def build_controllers(task: trainer.Task, runtime: trainer.RuntimeConfig,
                      config: trainer.TrainerConfig, summary_root: str
                      ) -> Dict[str, controller_lib.Controller]:
  """Builds both trainings in one process, as `train.py` builds a run.

  Raises:
    errors.ConfigError: If the configuration gives no mixture.
  """
  if not (config.mixture or config.mixture_schedule or task.mixture_rates()):
    raise errors.ConfigError(
        "the configuration trains on one dataset: give a Task whose "
        "`build_inputs(training=True)` returns sources by name, and their "
        "rates (`trainer.mixture`), e.g. gin/digits_mixture.gin.")
  setup = build.process(runtime)
  # One source first: where building first gives an edge (the place of
  # memory, threads), it goes to the baseline, not to the mixture.
  alone = build.parts(one_source(task), "train", setup,
                      dataclasses.replace(config, mixture=None,
                                          mixture_schedule=None))
  mixed = build.parts(task, "train", setup, config)
  return {name: build.controller(parts, os.path.join(summary_root, str(i)),
                                 saves=False)
          for i, (name, parts) in enumerate(zip(CONTENDERS, (mixed, alone)))}


def time_rounds(controllers: Dict[str, controller_lib.Controller],
                steps: int, rounds: int, warmup: int) -> Dict[str, List[float]]:
  """Returns each training's milliseconds per step in every round."""
  results = {name: [] for name in controllers}

  def train(controller, num_steps):
    controller.train(controller.step + num_steps)

  with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
    for controller in controllers.values():
      train(controller, warmup)
    for round_index in range(rounds):
      order = CONTENDERS if round_index % 2 == 0 else CONTENDERS[::-1]
      for name in order:
        start = time.perf_counter()
        train(controllers[name], steps)
        results[name].append(1e3 * (time.perf_counter() - start) / steps)
  return results


def main(gin_files: List[str], task: trainer.Task,
         runtime: trainer.RuntimeConfig,
         config: trainer.TrainerConfig) -> None:
  del gin_files
  console.configure(verbosity_asked=FLAGS["verbosity"].present)
  # Room for the warm-up and every round, whatever the configuration says.
  warmup = 2 * config.steps_per_loop
  config = dataclasses.replace(
      config, train_steps=warmup + FLAGS.rounds * FLAGS.steps)
  with tempfile.TemporaryDirectory() as summary_root:
    try:
      controllers = build_controllers(task, runtime, config, summary_root)
    except errors.ConfigError as e:
      cli.fail(str(e), program="benchmark_mixture.py")
    results = time_rounds(controllers, FLAGS.steps, FLAGS.rounds, warmup)
  ratios = [mixed / alone for mixed, alone in
            zip(results["mixture"], results["one source"])]
  ratio = statistics.median(ratios)
  print(f"{type(task).__name__}: global batch {config.global_batch_size}, "
        f"steps_per_loop {config.steps_per_loop}, {FLAGS.rounds} round(s) "
        f"of {FLAGS.steps} steps each, median")
  print(f"{'contender':<12}{'ms/step':>9}{'min':>9}{'max':>9}")
  for name in CONTENDERS:
    times = results[name]
    print(f"{name:<12}{statistics.median(times):9.3f}{min(times):9.3f}"
          f"{max(times):9.3f}")
  verdict = "PASS" if ratio <= TARGET else "FAIL"
  print(f"step time, mixture / one source: {ratio:.3f}x "
        f"(target <= {TARGET:.2f}x: {verdict})")
  print("JSON " + json.dumps({
      "ms_per_step": {name: statistics.median(results[name])
                      for name in CONTENDERS},
      "step_time_ratio": ratio, "round_ratios": ratios}))


if __name__ == "__main__":
  cli.run_tool(main, "benchmark_mixture.py", "gin/digits_mixture.gin")
