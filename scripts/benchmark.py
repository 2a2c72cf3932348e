"""Training throughput of our runner against a bare loop, Orbit and Keras.

In one process, with one model (MLP 784-256-256-10, tf_keras, SGD, sparse
categorical crossentropy from logits, loss scaled by the GLOBAL batch), one
data set (4,096 random in-memory examples, repeated, global batch 256,
prefetched) and one strategy object, it times four contenders:

  ours   `trainer.loop.control.controller.Controller` driving
         `trainer.loop.runner.runners.TaskTrainer` built from a
         `trainer.Task` by `trainer.build`, as `train.py` builds them,
         with train summaries written to a temporary directory every
         `SUMMARY_INTERVAL` (100) steps at both `steps_per_loop` values,
         and its progress line printed every loop; no checkpoints.
  bare   a `tf.function` with `for _ in tf.range(n)` around `strategy.run`
         over an `experimental_distribute_dataset` iterator, as in
         TensorFlow's custom-training-loop tutorial, called with
         n = `steps_per_loop` and nothing else done between calls.
  orbit  raw `orbit.Controller` and an `orbit.StandardTrainer` with the same
         step and a mean-loss metric; no summaries, no checkpoints.
  keras  tf_keras `Model.fit` with `steps_per_execution=steps_per_loop`.

At `steps_per_loop` 100 and 1, each contender is warmed up (tracing is left
out of the timings), then each runs `--steps` steps in each of `--rounds`
rounds. Within a round, ours, bare and orbit take turns a chunk of
`CHUNK_STEPS` (100) steps at a time (a loop, at `steps_per_loop=100`), in an
order reversed every chunk and rotated every round, so a slow spell of a
shared host falls on all three; Keras's `fit` starts its input anew at
every call, so it runs its steps in one call, after them. Every timed
region ends by reading the optimizer's step count on the host, so no
queued work escapes the clock. The per-loop printing of ours and orbit goes
to os.devnull: it happens, and costs what it costs, but stays off the
screen. The median steps/s per contender is reported, and its ratio to
bare: the median over the rounds of the ratio within a round.

Targets: ours >= 1.00x bare at steps_per_loop=100 and >= 0.97x bare at
steps_per_loop=1: every guarantee on (the non-finite guard, the progress
line, the summaries, preemption), and work that is not due at a loop
costs nothing.

Usage, from the repository root:
  python scripts/benchmark.py [--strategy=mirrored] [--num_cpu_devices=2]
      [--rounds=9] [--steps=N]

The last line printed is `JSON {...}`: median steps/s per contender for each
`steps_per_loop`, and under `vs_bare` the ratios to bare.
"""

# local-paths-only: its summaries go to a temporary folder it makes, its
# progress to os.devnull; nothing else but this repository

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402  Selects Keras 2 before TensorFlow loads.
from absl import app
from absl import flags
import numpy as np
import orbit
import tensorflow as tf
import tf_keras

from trainer import build
from trainer import console
from trainer.report import usage

FLAGS = flags.FLAGS
flags.DEFINE_enum("strategy", "one_device", ["one_device", "mirrored"],
                  "Distribution strategy shared by every contender.")
flags.DEFINE_integer("num_cpu_devices", 2, "Logical CPU devices (replicas) "
                     "for `mirrored`; ignored by `one_device`.", lower_bound=1)
flags.DEFINE_integer("rounds", 9, "Timed rounds per contender.",
                     lower_bound=1)
flags.DEFINE_integer("steps", None, "Steps per contender per round, a "
                     "multiple of 100; default 1000 at steps_per_loop=100 "
                     "and 400 at steps_per_loop=1.", lower_bound=100)
flags.register_validator("steps", lambda steps: steps is None or
                         steps % 100 == 0, "--steps must be a multiple of 100.")

CONTENDERS = ("ours", "bare", "orbit", "keras")
STEPS_PER_LOOP = (100, 1)
DEFAULT_STEPS = {100: 1000, 1: 400}
TARGETS = {100: 1.0, 1: 0.97}
SUMMARY_INTERVAL = 100
# Steps a contender runs before the next one's turn, within a round. (A
# round of 1,000 steps each, run whole one after the other, took 3 s a
# contender here, and its ratio to bare moved by 10%: the host's slow spells
# last seconds. In chunks of 100, alternating, the ratios of five blocks
# kept within 4% of each other.) `--steps` is a multiple of it.
CHUNK_STEPS = 100
# The contenders that take turns a chunk at a time; Keras runs after them.
INTERLEAVED = ("ours", "bare", "orbit")
GLOBAL_BATCH_SIZE = 256
NUM_EXAMPLES = 4096
LEARNING_RATE = 0.01

# Runs n more steps, then returns the optimizer's step count read on the host.
Run = Callable[[int], int]


def random_examples():
  """Returns fixed random `(features [n, 784] float32, labels [n] int32)`."""
  rng = np.random.RandomState(0)
  features = rng.normal(size=(NUM_EXAMPLES, 784)).astype(np.float32)
  labels = rng.randint(0, 10, size=NUM_EXAMPLES).astype(np.int32)
  return features, labels


def build_model() -> tf_keras.Model:
  """Returns the MLP, identically initialised on every call."""
  tf_keras.utils.set_random_seed(0)
  return tf_keras.Sequential([
      tf_keras.Input((784,)),
      tf_keras.layers.Dense(256, activation="relu"),
      tf_keras.layers.Dense(256, activation="relu"),
      tf_keras.layers.Dense(10),
  ], name="mlp")


def per_example_loss(labels, logits) -> tf.Tensor:
  """Returns the crossentropy of each example, shape `[batch]`."""
  return tf_keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True)


class RandomMlpTask(trainer.Task):
  """The benchmark's model and data as a Task, for our runner."""

  def __init__(self, features: np.ndarray, labels: np.ndarray):
    self.features = features
    self.labels = labels

  def build_model(self) -> tf_keras.Model:
    return build_model()

  def build_inputs(self, training, input_context=None) -> tf.data.Dataset:
    del training, input_context
    return tf.data.Dataset.from_tensor_slices((self.features, self.labels))

  def build_losses(self, labels, model_outputs, aux_losses=None):
    del aux_losses
    return per_example_loss(labels, model_outputs)

  def create_optimizer(self, settings) -> tf_keras.optimizers.Optimizer:
    del settings  # The same optimizer as the other contenders.
    return tf_keras.optimizers.SGD(LEARNING_RATE)


def batched_dataset(features: np.ndarray,
                    labels: np.ndarray) -> tf.data.Dataset:
  """Returns the global batches that bare, orbit and keras read."""
  dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat()
  return dataset.batch(GLOBAL_BATCH_SIZE, drop_remainder=True).prefetch(
      tf.data.AUTOTUNE)


def make_replica_step(model: tf_keras.Model,
                      optimizer: tf_keras.optimizers.Optimizer):
  """Returns the per-replica train step of bare and orbit."""

  def replica_step(features, labels):
    with tf.GradientTape() as tape:
      logits = model(features, training=True)
      loss = tf.nn.compute_average_loss(
          per_example_loss(labels, logits),
          global_batch_size=GLOBAL_BATCH_SIZE)
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  return replica_step


def build_ours(setup: build.Process, task: RandomMlpTask,
               steps_per_loop: int, train_steps: int, summary_dir: str) -> Run:
  """Returns a run function over our Controller and TaskTrainer, built by
  `trainer.build` as `train.py` builds them, without checkpoints."""
  config = trainer.TrainerConfig(
      train_steps=train_steps, steps_per_loop=steps_per_loop,
      summary_interval=SUMMARY_INTERVAL, global_batch_size=GLOBAL_BATCH_SIZE)
  parts = build.parts(task, "train", setup, config)
  controller = build.controller(parts, summary_dir, saves=False)
  optimizer = parts.state.optimizer

  def run(num_steps: int) -> int:
    controller.train(controller.step + num_steps)
    return int(optimizer.iterations.numpy())

  return run


def build_bare(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset,
               steps_per_loop: int) -> Run:
  """Returns a run function over a bare `tf.function` loop.

  Like the other contenders, it returns to Python every `steps_per_loop`
  steps, and does nothing there.
  """
  with strategy.scope():
    model = build_model()
    optimizer = tf_keras.optimizers.SGD(LEARNING_RATE)
  replica_step = make_replica_step(model, optimizer)
  iterator = iter(strategy.experimental_distribute_dataset(dataset))
  loop_steps = tf.constant(steps_per_loop)

  @tf.function
  def train_steps(iterator, num_steps):
    for _ in tf.range(num_steps):
      strategy.run(replica_step, args=next(iterator))

  def run(num_steps: int) -> int:
    for _ in range(num_steps // steps_per_loop):
      train_steps(iterator, loop_steps)
    return int(optimizer.iterations.numpy())

  return run


class OrbitTrainer(orbit.StandardTrainer):
  """The bare step in a plain Orbit trainer, with a mean-loss output."""

  def __init__(self, strategy: tf.distribute.Strategy,
               dataset: tf.data.Dataset, model: tf_keras.Model,
               optimizer: tf_keras.optimizers.Optimizer,
               global_step: tf.Variable):
    self.strategy = strategy
    self.global_step = global_step
    self._replica_step = make_replica_step(model, optimizer)
    # Updated in cross-replica context, so created outside the scope.
    self._loss = tf_keras.metrics.Mean("loss")
    super().__init__(strategy.experimental_distribute_dataset(dataset))

  def train_loop_begin(self):
    self._loss.reset_state()

  def train_step(self, iterator):
    losses = self.strategy.run(self._replica_step, args=next(iterator))
    self._loss.update_state(self.strategy.reduce(
        tf.distribute.ReduceOp.SUM, losses, axis=None))
    self.global_step.assign_add(1)

  def train_loop_end(self) -> Dict[str, tf.Tensor]:
    return {"loss": self._loss.result()}


def build_orbit(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset,
                steps_per_loop: int) -> Run:
  """Returns a run function over raw `orbit.Controller`."""
  with strategy.scope():
    model = build_model()
    optimizer = tf_keras.optimizers.SGD(LEARNING_RATE)
    global_step = orbit.utils.create_global_step()
  controller = orbit.Controller(
      global_step=global_step,
      trainer=OrbitTrainer(strategy, dataset, model, optimizer, global_step),
      strategy=strategy,
      steps_per_loop=steps_per_loop)

  def run(num_steps: int) -> int:
    controller.train(int(global_step.numpy()) + num_steps)
    return int(optimizer.iterations.numpy())

  return run


def build_keras(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset,
                steps_per_loop: int) -> Run:
  """Returns a run function over tf_keras `Model.fit`."""
  with strategy.scope():
    model = build_model()
    model.compile(
        optimizer=tf_keras.optimizers.SGD(LEARNING_RATE),
        loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_loop)

  def run(num_steps: int) -> int:
    model.fit(dataset, epochs=1, steps_per_epoch=num_steps, verbose=0)
    return int(model.optimizer.iterations.numpy())

  return run


def seconds_for(run: Run, num_steps: int, expected_total: int,
                devnull) -> float:
  """Times `run(num_steps)`, host sync included; checks the step count."""
  with contextlib.redirect_stdout(devnull):
    start = time.perf_counter()
    total = run(num_steps)
    elapsed = time.perf_counter() - start
  if total != expected_total:
    raise RuntimeError(f"expected {expected_total} steps in all, ran {total}.")
  return elapsed


def benchmark(setup: build.Process, features: np.ndarray,
              labels: np.ndarray, steps_per_loop: int, num_steps: int,
              rounds: int, summary_dir: str) -> Dict[str, List[float]]:
  """Warms up the contenders, then times them in turns.

  Returns:
    Contender name -> steps/s of each round.
  """
  warmup_steps = max(2 * steps_per_loop, SUMMARY_INTERVAL)
  train_steps = warmup_steps + rounds * num_steps
  dataset = batched_dataset(features, labels)
  strategy = setup.strategy
  runs = {
      "ours": build_ours(setup, RandomMlpTask(features, labels),
                         steps_per_loop, train_steps, summary_dir),
      "bare": build_bare(strategy, dataset, steps_per_loop),
      "orbit": build_orbit(strategy, dataset, steps_per_loop),
      "keras": build_keras(strategy, dataset, steps_per_loop),
  }
  results = {name: [] for name in CONTENDERS}
  done = dict.fromkeys(CONTENDERS, warmup_steps)  # Steps run so far.
  with open(os.devnull, "w") as devnull:
    for name in CONTENDERS:
      seconds_for(runs[name], warmup_steps, warmup_steps, devnull)
    for round_index in range(rounds):
      shift = round_index % len(INTERLEAVED)
      order = INTERLEAVED[shift:] + INTERLEAVED[:shift]
      seconds = dict.fromkeys(CONTENDERS, 0.0)
      for chunk in range(num_steps // CHUNK_STEPS):
        for name in order if chunk % 2 == 0 else order[::-1]:
          done[name] += CHUNK_STEPS
          seconds[name] += seconds_for(runs[name], CHUNK_STEPS, done[name],
                                       devnull)
      done["keras"] += num_steps
      seconds["keras"] = seconds_for(runs["keras"], num_steps, done["keras"],
                                     devnull)
      for name in CONTENDERS:
        results[name].append(num_steps / seconds[name])
  return results


def report(steps_per_loop: int, num_steps: int,
           results: Dict[str, List[float]]
           ) -> Tuple[Dict[str, float], Dict[str, float]]:
  """Prints one steps_per_loop's table.

  Returns:
    Contender name -> median steps/s, and -> median ratio to bare.
  """
  medians = {name: statistics.median(results[name]) for name in CONTENDERS}
  ratios = {name: statistics.median(
      rate / bare for rate, bare in zip(results[name], results["bare"]))
            for name in CONTENDERS}
  target = TARGETS[steps_per_loop]
  print(f"\nsteps_per_loop={steps_per_loop}: {num_steps} steps per contender "
        f"per round; ours writes summaries every {SUMMARY_INTERVAL} steps")
  print(f"{'contender':<10}{'median':>9}{'min':>9}{'max':>9}{'vs bare':>9}"
        "  (steps/s)")
  for name in CONTENDERS:
    ratio = ratios[name]
    verdict = ""
    if name == "ours":
      passed = "PASS" if ratio >= target else "FAIL"
      verdict = f"  target >= {target:.2f}x: {passed}"
    print(f"{name:<10}{medians[name]:9.1f}{min(results[name]):9.1f}"
          f"{max(results[name]):9.1f}{ratio:8.3f}x{verdict}")
  return medians, ratios


def main(argv):
  del argv
  wall_start = time.perf_counter()
  # As in train.py: INFO logs would repeat the per-loop progress lines.
  console.configure(verbosity_asked=FLAGS["verbosity"].present)
  mirrored = FLAGS.strategy == "mirrored"
  runtime = trainer.RuntimeConfig(
      distribution_strategy=FLAGS.strategy,
      num_cpu_devices=FLAGS.num_cpu_devices if mirrored else 0)
  setup = build.process(runtime)
  strategy = setup.strategy
  features, labels = random_examples()
  print(f"strategy {FLAGS.strategy} ({type(strategy).__name__}, "
        f"{strategy.num_replicas_in_sync} replica(s)), global batch "
        f"{GLOBAL_BATCH_SIZE}, {FLAGS.rounds} rounds, median of rounds")
  figures = {"vs_bare": {}}
  with tempfile.TemporaryDirectory() as summary_root:
    for steps_per_loop in STEPS_PER_LOOP:
      num_steps = FLAGS.steps or DEFAULT_STEPS[steps_per_loop]
      results = benchmark(
          setup, features, labels, steps_per_loop, num_steps,
          FLAGS.rounds, os.path.join(summary_root, f"spl{steps_per_loop}"))
      key = f"steps_per_loop_{steps_per_loop}"
      figures[key], figures["vs_bare"][key] = report(
          steps_per_loop, num_steps, results)
  print(f"\nwall time {time.perf_counter() - wall_start:.0f} s")
  print("JSON " + json.dumps(figures))


if __name__ == "__main__":
  usage.exit_if_requested(sys.argv, __doc__)
  app.run(main)
