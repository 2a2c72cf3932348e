"""Is training input-bound? The input pipeline alone against training.

For a task's gin configuration (the files and bindings `train.py` takes), in
one process, it builds the training input exactly as a run does (the task's
pipeline, the framework's batching, splitting and prefetching) and times:

  pipeline          the batches alone, read as fast as they come;
  training          training steps on that pipeline, with the share of time
                    the steps waited for a batch;
  training, cached  the same steps on batches taken from the same pipeline
                    and cached in memory, so input costs nothing.

Each round times `--steps` steps of one training, then of the other (the
order alternates between rounds). The step time ratio is the median over the
rounds of the two step times' ratio within a round: a pair of short legs
sees the same machine, so a slow spell on a shared host (seen here for
seconds at a time) slows both sides instead of one. The verdict:
input-bound when the pipeline alone is slower than cached training or the
real step time exceeds the cached one by more than 5%, the target for the
shipped MNIST and CIFAR-10 pipelines.

With `--data_service_workers=N` it also times training on the same
pipeline run by the tf.data service: for each k in 1..N, a dispatcher and k
workers, each a `scripts/data_service.py` process on 127.0.0.1 (started
before, stopped after), feed one more contender, `service, k worker(s)`,
timed in the same rounds; its step time over the local pipeline's is the
median of the rounds' ratios. On a host with few cores the workers compete
with training for them, as local input does: the figure says whether moving
the pipeline into processes of its own pays here, not what other hosts'
CPUs would give.

Usage, from the repository root:
  python scripts/benchmark_input.py gin/cifar10.gin [--gin_param=...]
      [--fake_data=10000] [--steps=100] [--rounds=31]
      [--data_service_workers=2]

`--fake_data=N` writes N random training examples in the task's tfds format
to a temporary directory and reads them through the real pipeline (tfds
files, decoding, shuffling, augmentation): no download needed. The last line
is `JSON {...}` with the figures.
"""

# local-paths-only: its fake data goes to a temporary folder it makes, its
# output to os.devnull; nothing else but this repository

import contextlib
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402  Selects Keras 2 before TensorFlow loads.
from absl import flags
import tensorflow as tf

from tasks import fake_data
from trainer import build
from trainer import cli
from trainer import console
from trainer.data import inputs as inputs_lib
from trainer.loop.runner import runners

FLAGS = flags.FLAGS
flags.DEFINE_integer("fake_data", 0, "Write this many random training "
                     "examples in the task's tfds format and read them; 0 "
                     "reads the configured data.", lower_bound=0)
flags.DEFINE_integer("steps", 100, "Timed steps of each training per round, "
                     "and twice as many batches for the pipeline alone.",
                     lower_bound=10)
flags.DEFINE_integer("rounds", 31, "Rounds, each timing both trainings.",
                     lower_bound=1)
flags.DEFINE_integer("cached_batches", 50, "Batches cached for the cached "
                     "training.", lower_bound=1)
flags.DEFINE_integer("data_service_workers", 0, "Also time training fed by "
                     "the tf.data service with 1, ..., N local workers.",
                     lower_bound=0)

TARGET = 1.05  # Real step time over cached step time.
LOOP = 10  # Steps per `train` call.


def time_pipeline(dataset: tf.data.Dataset, num_batches: int,
                  batch_size: int) -> float:
  """Returns examples/s of reading `num_batches` batches, after a warm-up."""
  iterator = iter(dataset)
  for _ in range(min(num_batches // 5, 20) + 1):
    next(iterator)
  start = time.perf_counter()
  for _ in range(num_batches):
    next(iterator)
  return num_batches * batch_size / (time.perf_counter() - start)


def time_training(task_trainer: runners.TaskTrainer, num_steps: int
                  ) -> Dict[str, float]:
  """Returns steps/s and the input-wait share of `num_steps` steps."""
  task_trainer.read_and_reset_metrics()
  loop = tf.constant(LOOP)
  start = time.perf_counter()
  for _ in range(num_steps // LOOP):
    task_trainer.train(loop)
  task_trainer.loop_status()  # Waits for the last step.
  elapsed = time.perf_counter() - start
  waited = task_trainer.read_and_reset_metrics().get("input_wait_seconds", 0)
  return {"steps_per_second": num_steps // LOOP * LOOP / elapsed,
          "input_wait": waited / elapsed}


def main(gin_files: List[str], task: trainer.Task,
         runtime: trainer.RuntimeConfig,
         config: trainer.TrainerConfig) -> None:
  del gin_files
  console.configure(verbosity_asked=FLAGS["verbosity"].present)
  with tempfile.TemporaryDirectory() as data_dir, contextlib.ExitStack() as (
      services):
    if FLAGS.fake_data:
      fake_data.write_for_task(task, data_dir, FLAGS.fake_data)
    dispatchers = [services.enter_context(data_service(workers))
                   for workers in range(1, FLAGS.data_service_workers + 1)]
    report(task, runtime, config, dispatchers)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def data_service(num_workers: int) -> Iterator[str]:
  """Runs a tf.data service dispatcher and `num_workers` workers, each a
  `scripts/data_service.py` process on 127.0.0.1; yields the dispatcher's
  address and stops them all on leaving."""
  script = os.path.join(REPO_ROOT, "scripts", "data_service.py")
  port = _free_port()
  processes = []
  try:
    for index in range(num_workers + 1):
      args = [f"--port={port if index == 0 else _free_port()}"]
      if index:
        args += [f"--dispatcher=127.0.0.1:{port}", "--host=127.0.0.1"]
      process = subprocess.Popen([sys.executable, script, *args],
                                 stdout=subprocess.PIPE, text=True)
      processes.append(process)
      line = process.stdout.readline()  # The server serves once it prints.
      if "serving" not in line:
        raise RuntimeError(f"data_service.py {' '.join(args)} did not "
                           f"start: {line or 'no output'}")
    yield f"grpc://127.0.0.1:{port}"
  finally:
    for process in processes:
      process.terminate()
    for process in processes:
      process.wait(timeout=30)


def report(task: trainer.Task, runtime: trainer.RuntimeConfig,
           config: trainer.TrainerConfig, dispatchers: List[str]) -> None:
  """Times the pipeline and every training; prints the table."""
  setup = build.process(runtime)
  strategy = setup.strategy

  def build_input(contender_runtime=runtime):
    return inputs_lib.for_task(task, True, strategy, config,
                               contender_runtime, setup.worker)

  inputs = {"real": build_input()}
  batch = config.global_batch_size
  pipeline = time_pipeline(inputs["real"].build(), 2 * FLAGS.steps, batch)
  inputs["cached"] = build_input()
  inputs["cached"].dataset = inputs["cached"].build().take(
      FLAGS.cached_batches).cache().repeat()
  for workers, address in enumerate(dispatchers, start=1):
    inputs[_service_name(workers)] = build_input(
        dataclasses.replace(runtime, data_service=address))
  # One state for every contender: they train the same model in turns.
  state = build.state(task, setup, inputs["real"].dataset.element_spec,
                      config, training=True)
  trainers = {name: build.trainer(task, state, contender_input, config,
                                  runtime)
              for name, contender_input in inputs.items()}
  results = time_rounds(trainers)
  print(f"{type(task).__name__}: global batch {batch}, "
        f"{strategy.num_replicas_in_sync} replica(s), "
        f"{FLAGS.rounds} round(s) of {FLAGS.steps} steps each, median")
  print_figures(results, pipeline, batch, len(dispatchers))


def time_rounds(trainers: Dict[str, runners.TaskTrainer]
                ) -> Dict[str, List[Dict[str, float]]]:
  """Times every trainer `--steps` steps a round, each going first in turn
  (with two: alternating); returns each one's figures per round."""
  results = {name: [] for name in trainers}
  with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
    for name, task_trainer in trainers.items():
      # Traces the loop and, for the cached one, fills the cache.
      time_training(task_trainer, max(FLAGS.cached_batches, 2 * LOOP))
    names = list(trainers)
    for round_index in range(FLAGS.rounds):
      shift = round_index % len(names)
      for name in names[shift:] + names[:shift]:
        results[name].append(time_training(trainers[name], FLAGS.steps))
  return results


def print_figures(results: Dict[str, List[Dict[str, float]]],
                  pipeline: float, batch: int, num_services: int) -> None:
  """Prints the table, the verdict and the `JSON` line."""
  medians = {name: {key: statistics.median(r[key] for r in rounds)
                    for key in rounds[0]} for name, rounds in results.items()}
  real, cached = medians["real"], medians["cached"]
  round_ratios = [c["steps_per_second"] / r["steps_per_second"]
                  for r, c in zip(results["real"], results["cached"])]
  ratio = statistics.median(round_ratios)
  width = max(18, *(len(name) + 2 for name in results))
  print(f"{'':<{width}}{'examples/s':>12}{'input wait':>12}")
  print(f"{'pipeline':<{width}}{pipeline:12.0f}")
  labels = {"real": "training", "cached": "training, cached"}
  for name in results:
    print(f"{labels.get(name, name):<{width}}"
          f"{medians[name]['steps_per_second'] * batch:12.0f}"
          f"{100 * medians[name]['input_wait']:11.1f}%")
  bound = ratio > TARGET or pipeline < cached["steps_per_second"] * batch
  verdict = "the input pipeline" if bound else "the training step"
  print(f"step time, real pipeline / cached batches: {ratio:.3f}x (target "
        f"<= {TARGET:.2f}x: {'PASS' if ratio <= TARGET else 'FAIL'}); "
        f"bottleneck: {verdict}")
  figures = {
      "pipeline_examples_per_second": pipeline,
      "training_examples_per_second": real["steps_per_second"] * batch,
      "cached_examples_per_second": cached["steps_per_second"] * batch,
      "input_wait": real["input_wait"], "step_time_ratio": ratio,
      "round_ratios": round_ratios, "input_bound": bound}
  if num_services:
    figures["data_service"] = _service_figures(results, medians, batch,
                                               num_services)
    print("step time over the local pipeline's: " + "; ".join(
        f"{_service_name(int(k))} {v['step_time_vs_local']:.3f}x"
        for k, v in figures["data_service"].items()))
  print("JSON " + json.dumps(figures))


def _service_name(workers: int) -> str:
  return f"service, {workers} worker{'s' if workers > 1 else ''}"


def _service_figures(results, medians, batch: int,
                     num_services: int) -> Dict[str, Dict[str, float]]:
  """Per worker count: examples/s, input wait and the step time over the
  local pipeline's (the median of the rounds' ratios)."""
  figures = {}
  for workers in range(1, num_services + 1):
    name = _service_name(workers)
    ratios = [local["steps_per_second"] / service["steps_per_second"]
              for local, service in zip(results["real"], results[name])]
    figures[str(workers)] = {
        "examples_per_second": medians[name]["steps_per_second"] * batch,
        "input_wait": medians[name]["input_wait"],
        "step_time_vs_local": statistics.median(ratios),
        "round_ratios": ratios}
  return figures


if __name__ == "__main__":
  cli.run_tool(main, "benchmark_input.py", "gin/cifar10.gin")
