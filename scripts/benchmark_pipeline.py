"""Pipeline parallelism's throughput against naive model parallelism.

K balanced stages (an MLP of `--layers_per_stage` dense layers of
`--width` units per stage, SGD, the loss scaled by the global batch) on K
logical CPU devices, with one intra-op thread (each op runs on one core)
and K inter-op threads (K ops at once), so that each device is one core, as
each GPU is its own device. The framework's own pieces run it:
`trainer.distribute.pipeline.build` cuts and places the model, and the
default `Task.train_step` runs with `trainer.model.pipelined`'s gradient
function, `--steps` steps per `tf.function` call (no host work between
steps).

Contenders: the model whole on one device (`one_device`); the K stages
with M = 1 (`naive`: naive model parallelism); the same with one op at a
time (`serial`: every thread of the process pinned to one core while it
runs); the pipeline at each M of `--microbatches`.

Why `serial`: TensorFlow's logical CPU devices share one inter-op thread
pool, so the K threads are not one per device: `naive` runs a layer's two
backward products (weight and input gradient) at once on two cores, which a
GPU, whose one stream runs one op at a time, would not (its `overlap`, about
0.36, shows it). So `naive` here is faster than naive model parallelism on
devices that each run one op at a time, and the speedup over it is capped
below GPipe's ideal by the host, not by the pipeline: on 2 cores, by 2 /
naive's own parallelism. `serial` is the other bound: devices that each run
one op at a time, and no overlap at all between devices (on GPUs stage k's
weight gradient can overlap stage k-1's backward, a little). The pipeline
is measured against both. After a warm-up
(tracing left out), the contenders take turns over `--rounds` rounds, in a
rotating order; each ratio to naive is the median over the rounds of the
ratio within a round, where the two ran back to back, so a slow spell on a
shared host slows both sides. Beside each, GPipe's ideal K*M/(M+K-1): the
bubble (K-1)/(M+K-1) of each device's time is idle.

Overlap: from a profiler trace of one round's steps, the share of the
time some matrix product runs during which another runs too (on the other
device: each op has one thread). It shows the executor overlapping the
stages whatever else the host is running, which the throughput ratios need
a quiet host for.

CPU: the process's CPU seconds per step, as a ratio to naive's: the work
micro-batches add (each computes a whole weight gradient, and M of them
are summed). On K free cores the speedup cannot pass the ideal divided by
it; unlike steps/s, it hardly depends on what else the host runs.

Memory: the peak bytes TensorFlow's CPU allocator held during one step, at
M = 8 with and without `pipeline.recompute`. Logical CPU devices share one
allocator, so this is the peak of all stages together; per-device peaks
need GPUs (`tf.config.experimental.get_memory_info("GPU:k")`).

Usage, from the repository root:
  python scripts/benchmark_pipeline.py [--stages=2] [--microbatches=2,4,8,16]
      [--rounds=5] [--steps=10]

The last line printed is `JSON {...}`, with `stages`, `microbatches`,
`speedup_vs_naive`, `speedup_vs_serial` and `ideal` for the figure the
issue asks for (M = 8, or the largest M run), and every contender's figures
under `all`. `of ideal` in the table is the speedup over naive, then over
serial, divided by the ideal.
"""

# local-paths-only: its profile goes to a temporary folder it makes; /proc and
# this repository besides

import contextlib
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
# The CPU allocator keeps peak statistics only as a BFC allocator; set
# before TensorFlow starts.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402  Selects Keras 2 before TensorFlow loads.
from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
import tf_keras

# pylint: disable-next=g-direct-tensorflow-import
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from trainer.distribute import devices
from trainer.distribute import pipeline
from trainer.model import gradients
from trainer.model import pipelined
from trainer.report import usage

FLAGS = flags.FLAGS
flags.DEFINE_integer("stages", 2, "K: stages, each on its logical CPU.")
flags.DEFINE_list("microbatches", ["2", "4", "8", "16"],
                  "The M values of the pipeline (naive M=1 always runs).")
flags.DEFINE_integer("rounds", 5, "Timed rounds per contender.")
flags.DEFINE_integer("steps", 10, "Steps per contender per round.")
flags.DEFINE_integer("batch", 1024, "Global batch size.")
flags.DEFINE_integer("width", 1024, "Units of every dense layer.")
flags.DEFINE_integer("layers_per_stage", 2, "Dense layers per stage.")

REPORTED_M = 8


class _MlpTask(trainer.Task):
  """Regression of random targets by a K-stage MLP."""

  def __init__(self, num_layers: int, width: int):
    self.num_layers = num_layers
    self.width = width

  def build_model(self) -> tf_keras.Model:
    layers = [tf_keras.Input((self.width,))]
    layers += [tf_keras.layers.Dense(self.width, activation="relu",
                                     name=f"dense{i}")
               for i in range(self.num_layers)]
    return tf_keras.Sequential(layers, name="mlp")

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.reduce_mean(tf.square(labels - model_outputs), axis=-1)


def ideal(num_stages: int, num_microbatches: int) -> float:
  """GPipe's speedup over naive model parallelism: K*M/(M+K-1)."""
  return num_stages * num_microbatches / (num_microbatches + num_stages - 1)


def build_contender(task: _MlpTask, batch, num_stages: int,
                    num_microbatches: int, recompute: bool = False
                    ) -> Callable[[int], float]:
  """Returns `run(num_steps) -> seconds` for a fresh model: whole on one
  device when `num_microbatches` is 0, else pipelined in K stages."""
  model = task.build_model()
  options = gradients.StepOptions()
  if num_microbatches:
    per_stage = task.num_layers // num_stages
    config = pipeline.PipelineConfig(
        boundaries=[f"dense{per_stage * (k + 1) - 1}"
                    for k in range(num_stages - 1)],
        num_microbatches=num_microbatches, recompute=recompute)
    model, stages = pipeline.build(model, config, lambda unused: None)
    options = gradients.StepOptions(gradient_fn=pipelined.gradient_fn(
        task, stages, config, micro_batch_examples=FLAGS.batch))
  else:
    with tf.device("/device:CPU:0"):
      model = tf_keras.models.clone_model(model)
  optimizer = tf_keras.optimizers.SGD(1e-4)

  @tf.function
  def steps(num_steps):
    for _ in tf.range(num_steps):
      task.train_step(batch, model, optimizer, options=options)
    return optimizer.iterations.read_value()

  def run(num_steps: int) -> float:
    start, cpu = time.perf_counter(), time.process_time()
    steps(tf.constant(num_steps)).numpy()  # Waits for every step.
    run.cpu_seconds = time.process_time() - cpu
    return time.perf_counter() - start

  run(1)  # Traces and warms up.
  return run


@contextlib.contextmanager
def one_core():
  """Pins every thread of this process to one core, and back."""
  everything = os.sched_getaffinity(0)
  threads = [int(t) for t in os.listdir("/proc/self/task")]
  core = {min(everything)}
  for thread in threads:
    os.sched_setaffinity(thread, core)
  try:
    yield
  finally:
    for thread in threads:
      with contextlib.suppress(OSError):  # It may have ended.
        os.sched_setaffinity(thread, everything)


def serial(run: Callable[[int], float]) -> Callable[[int], float]:
  """`run` with one op at a time: the process on one core."""

  def run_serial(num_steps: int) -> float:
    with one_core():
      seconds = run(num_steps)
    run_serial.cpu_seconds = run.cpu_seconds
    return seconds

  return run_serial


def peak_bytes(run: Callable[[int], float]) -> int:
  """The allocator's peak during one step of `run`."""
  tf.config.experimental.reset_memory_stats("CPU:0")
  run(1)
  return tf.config.experimental.get_memory_info("CPU:0")["peak"]


def overlap(run: Callable[[int], float], num_steps: int) -> float:
  """The share of the time a MatMul runs in which another runs too, from a
  profiler trace of `run(num_steps)`."""
  with tempfile.TemporaryDirectory() as directory:
    tf.profiler.experimental.start(directory)
    run(num_steps)
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    path = glob.glob(os.path.join(directory, "**", "*.xplane.pb"),
                     recursive=True)[0]
    with open(path, "rb") as f:
      space.ParseFromString(f.read())
  edges = []
  for plane in space.planes:
    if plane.name != "/host:CPU":
      continue
    for line in plane.lines:
      for event in line.events:
        if "MatMul" in plane.event_metadata[event.metadata_id].name:
          start = line.timestamp_ns * 1000 + event.offset_ps
          edges += [(start, 1), (start + event.duration_ps, -1)]
  running, last, busy, together = 0, None, 0, 0
  for time_ps, change in sorted(edges):
    if last is not None:
      busy += (time_ps - last) if running >= 1 else 0
      together += (time_ps - last) if running >= 2 else 0
    running, last = running + change, time_ps
  return together / busy if busy else 0.0


def time_rounds(contenders: Dict[str, Callable[[int], float]]
                ) -> Tuple[Dict[str, List[float]], Dict[str, List[float]]]:
  """Steps/s and CPU seconds per step of every contender per round, the
  order rotating."""
  names = list(contenders)
  rates = {name: [] for name in names}
  cpu = {name: [] for name in names}
  for round_index in range(FLAGS.rounds):
    shift = round_index % len(names)
    for name in names[shift:] + names[:shift]:
      rates[name].append(FLAGS.steps / contenders[name](FLAGS.steps))
      cpu[name].append(contenders[name].cpu_seconds / FLAGS.steps)
  return rates, cpu


def table(contenders, rates, cpu, num_stages: int):
  """Prints a row per contender (steps/s, speedup over naive and over
  serial beside the ideal, overlap, CPU per step); returns the figures by
  contender."""
  print(f"{'contender':>10} {'steps/s':>8} {'vs naive':>9} {'vs serial':>10}"
        f" {'ideal':>6} {'of ideal':>10} {'overlap':>8} {'cpu/step':>9}")
  figures = {}
  for name, found in rates.items():
    ratio = statistics.median(a / b for a, b in zip(found, rates["naive"]))
    over_serial = statistics.median(
        a / b for a, b in zip(found, rates["serial"]))
    m = {"naive": 1, "serial": 1}.get(name) or (
        int(name[2:]) if name.startswith("M=") else None)
    best = ideal(num_stages, m) if m else None
    # Under `serial` two threads take turns on one core: their ops overlap
    # in time but not in work.
    together = (None if name == "serial" else
                overlap(contenders[name], FLAGS.steps))
    cpu_ratio = statistics.median(
        a / b for a, b in zip(cpu[name], cpu["naive"]))
    figures[name] = {"steps_per_s": round(statistics.median(found), 3),
                     "speedup_vs_naive": round(ratio, 3),
                     "speedup_vs_serial": round(over_serial, 3),
                     "ideal": round(best, 3) if best else None,
                     "overlap": round(together, 3) if together is not None
                                else None,
                     "cpu_vs_naive": round(cpu_ratio, 3)}
    best_text = f"{best:6.2f}" if best else f"{'-':>6}"
    share = (f"{ratio / best:.2f}/{over_serial / best:.2f}" if best else "-")
    together_text = f"{together:8.2f}" if together is not None else (
        f"{'-':>8}")
    print(f"{name:>10} {statistics.median(found):8.2f} {ratio:9.2f} "
          f"{over_serial:10.2f} {best_text} {share:>10} {together_text} "
          f"{cpu_ratio:8.2f}x")
  return figures


def main(argv):
  del argv
  num_stages = FLAGS.stages
  # Each contender traces its own step: TensorFlow's retracing warnings
  # would only fill the table's screen.
  tf.get_logger().setLevel("ERROR")
  values = sorted({int(m) for m in FLAGS.microbatches})
  # Each device one core: one thread per op, K ops at once.
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(num_stages)
  devices.split_cpu(num_stages, "--stages")
  rng = np.random.default_rng(0)
  batch = (tf.constant(rng.normal(size=(FLAGS.batch, FLAGS.width)),
                       tf.float32),
           tf.constant(rng.normal(size=(FLAGS.batch, FLAGS.width)),
                       tf.float32))
  task = _MlpTask(num_stages * FLAGS.layers_per_stage, FLAGS.width)
  contenders = {"one_device": build_contender(task, batch, num_stages, 0),
                "naive": build_contender(task, batch, num_stages, 1)}
  contenders["serial"] = serial(contenders["naive"])
  for m in values:
    contenders[f"M={m}"] = build_contender(task, batch, num_stages, m)
  rates, cpu = time_rounds(contenders)
  print(f"K={num_stages} stages of {FLAGS.layers_per_stage} x {FLAGS.width}"
        f" units, batch {FLAGS.batch}, {FLAGS.rounds} rounds of "
        f"{FLAGS.steps} steps; ratios: median over rounds of the ratio "
        "within a round")
  figures = table(contenders, rates, cpu, num_stages)
  memory_m = REPORTED_M if REPORTED_M in values else values[-1]
  kept = peak_bytes(contenders[f"M={memory_m}"])
  recomputed = peak_bytes(build_contender(task, batch, num_stages, memory_m,
                                          recompute=True))
  print(f"peak allocator bytes at M={memory_m} (all stages): "
        f"{kept / 2**20:.1f} MiB kept, {recomputed / 2**20:.1f} MiB "
        "recomputed")
  reported = figures[f"M={memory_m}"]
  print("JSON " + json.dumps({
      "stages": num_stages, "microbatches": memory_m,
      "speedup_vs_naive": reported["speedup_vs_naive"],
      "speedup_vs_serial": reported["speedup_vs_serial"],
      "ideal": reported["ideal"],
      "peak_bytes": {"kept": kept, "recomputed": recomputed},
      "all": figures}))


if __name__ == "__main__":
  usage.exit_if_requested(sys.argv, __doc__)
  app.run(main)
