"""Benchmark different strategies: one task under several runtime settings.

Each variant trains the task in a fresh `train.py` process (device splits,
precision policies and XLA are process-wide), for `--steps` steps in a
temporary directory, and the table reports from its TensorBoard summaries:
steps/s and examples/s (median of the summary windows after the first,
which holds tracing), the final training loss, and the process's peak
resident memory.

Usage, from the repository root:
  python scripts/compare_strategies.py gin/mnist.gin [--gin_param=...]
      [--fake_data=10000] [--steps=300]
      [--variant='name=FILE.gin,binding,...' ...]

A variant is a name and the gin files and bindings it adds; the defaults
compare one device, MirroredStrategy over 2 logical CPUs, bfloat16, float16
and XLA on this machine. With `--num_gpus=N`, GPU variants (one GPU, N
mirrored GPUs, float16, XLA) are compared instead. `--fake_data=N` writes N
random training examples in the task's tfds format (no download). The last
line is `JSON {...}` with the figures.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Optional, Sequence, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))  # local-path: this repository
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402  Selects Keras 2 before TensorFlow loads.
from absl import flags

from tasks import fake_data
from trainer import cli
from trainer.storage import files

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("variant", [], "NAME=ITEM,ITEM,...: gin files "
                          "(ending in .gin) and bindings added for one "
                          "variant; repeatable. Default: see --num_gpus.")
flags.DEFINE_integer("num_gpus", 0, "Compare GPU variants on this many GPUs "
                     "instead of the CPU ones.", lower_bound=0)
flags.DEFINE_integer("steps", 300, "Training steps per variant.",
                     lower_bound=20)
flags.DEFINE_integer("fake_data", 0, "Write this many random training "
                     "examples in the task's tfds format; 0 reads the "
                     "configured data.", lower_bound=0)
flags.DEFINE_integer("timeout", 1800, "Seconds a variant may run.",
                     lower_bound=1)

CPU_VARIANTS = (
    "one device=runtime.distribution_strategy='one_device'",
    "mirrored, 2 logical CPUs=gin/runtime/cpu_mirrored.gin",
    "bfloat16=runtime.distribution_strategy='one_device',"
    "runtime.mixed_precision_dtype='bfloat16'",
    "float16=runtime.distribution_strategy='one_device',"
    "runtime.mixed_precision_dtype='float16'",
    "XLA=runtime.distribution_strategy='one_device',runtime.enable_xla=True",
)


def gpu_variants(num_gpus: int) -> Tuple[str, ...]:
  """The GPU variants: one GPU, all of them, float16, XLA."""
  mirrored = ("runtime.distribution_strategy='mirrored',"
              f"runtime.num_gpus={num_gpus}")
  return (
      "1 GPU=runtime.distribution_strategy='one_device',runtime.num_gpus=1",
      f"{num_gpus} GPUs mirrored={mirrored}",
      f"{num_gpus} GPUs float16={mirrored},"
      "runtime.mixed_precision_dtype='float16'",
      f"{num_gpus} GPUs float16 XLA={mirrored},"
      "runtime.mixed_precision_dtype='float16',runtime.enable_xla=True",
  )


def parse_variant(text: str) -> Tuple[str, List[str], List[str]]:
  """Splits `NAME=ITEM,ITEM` into the name, gin files and bindings."""
  name, _, items = text.partition("=")
  if not name or not items:
    raise ValueError(f"--variant {text!r} is not NAME=ITEM,ITEM,...")
  parts = [item.strip() for item in items.split(",") if item.strip()]
  return (name.strip(), [p for p in parts if p.endswith(".gin")],
          [p for p in parts if not p.endswith(".gin")])


def read_scalars(log_dir: str) -> Dict[str, List[Tuple[int, float]]]:
  """Returns `{tag: [(step, value), ...]}` from the event files of a run."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  scalars = {}
  for path in files.glob(os.path.join(log_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name == "scalars":
          scalars.setdefault(value.tag, []).append(
              (event.step, float(tf.make_ndarray(value.tensor))))
  return scalars


def run_variant(gin_files: Sequence[str], bindings: Sequence[str],
                model_dir: str, steps: int, timeout: float
                ) -> Dict[str, Optional[float]]:
  """Trains one variant in a new process; returns its figures."""
  window = max(steps // 10 // 10 * 10, 10)
  args = [sys.executable, os.path.join(REPO_ROOT, "train.py"),
          f"--model_dir={model_dir}", "--mode=train",
          *[f"--gin_file={path}" for path in gin_files],
          *[f"--gin_param={binding}" for binding in bindings],
          f"--gin_param=trainer.train_steps={steps}",
          f"--gin_param=trainer.steps_per_loop={window}",
          f"--gin_param=trainer.summary_interval={window}",
          f"--gin_param=trainer.checkpoint_interval={steps * 10}",
          "--gin_param=trainer.validation_interval=0",
          "--gin_param=trainer.batch_scaling=None"]
  # A subprocess's stdout: a local file, in this script's temporary folder.
  log_path = os.path.join(model_dir, "log.txt")
  with open(log_path, "w") as log:  # local-path: our own temporary folder
    process = subprocess.Popen(args, cwd=REPO_ROOT, stdout=log,
                               stderr=subprocess.STDOUT)
    # `wait4` gives this child's own peak memory (`RUSAGE_CHILDREN` would
    # give the largest of all children so far).
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    try:
      _, status, usage = os.wait4(process.pid, 0)
    finally:
      timer.cancel()
      if process.poll() is None:
        process.kill()
    returncode = os.waitstatus_to_exitcode(status)
  if returncode != 0:
    with open(log_path) as log:  # local-path: our own temporary folder
      last = (log.read().strip().splitlines() or ["?"])[-1]
    if returncode < 0:
      last = f"killed after {timeout:g} s" if not timer.is_alive() else last
    return {"error": last}
  scalars = read_scalars(os.path.join(model_dir, "train"))
  rates = [value for _, value in scalars["steps_per_second"][1:]] or [
      value for _, value in scalars["steps_per_second"]]
  examples = [value for _, value in scalars["examples_per_second"][1:]] or [
      value for _, value in scalars["examples_per_second"]]
  return {"steps_per_second": statistics.median(rates),
          "examples_per_second": statistics.median(examples),
          "final_loss": scalars["loss"][-1][1],
          "peak_memory_mib": usage.ru_maxrss / 1024}


def main(task_files: List[str], task: trainer.Task,
         unused_runtime: trainer.RuntimeConfig,
         config: trainer.TrainerConfig) -> None:
  texts = FLAGS.variant or (gpu_variants(FLAGS.num_gpus) if FLAGS.num_gpus
                            else CPU_VARIANTS)
  try:
    variants = [parse_variant(text) for text in texts]
  except ValueError as e:
    cli.fail(str(e), program="compare_strategies.py")
  results = {}
  with tempfile.TemporaryDirectory() as root:  # local-path: our own folder
    extra = list(FLAGS.gin_param)
    if FLAGS.fake_data:
      extra.append(fake_data.write_for_task(task, os.path.join(root, "data"),
                                            FLAGS.fake_data))
    print(f"{type(task).__name__}: {FLAGS.steps} steps per variant, global "
          f"batch {config.global_batch_size}", flush=True)
    for index, (name, gin_files, bindings) in enumerate(variants):
      model_dir = os.path.join(root, f"variant{index}")
      files.makedirs(model_dir)
      results[name] = run_variant(task_files + gin_files, extra + bindings,
                                  model_dir, FLAGS.steps, FLAGS.timeout)
      print(f"  {name}: {results[name]}", flush=True)
  width = max(len(name) for name in results) + 2
  print(f"\n{'variant':<{width}}{'steps/s':>9}{'examples/s':>12}"
        f"{'final loss':>12}{'peak MiB':>10}")
  for name, result in results.items():
    if "error" in result:
      print(f"{name:<{width}}failed: {result['error']}")
      continue
    print(f"{name:<{width}}{result['steps_per_second']:9.1f}"
          f"{result['examples_per_second']:12.0f}"
          f"{result['final_loss']:12.4f}{result['peak_memory_mib']:10.0f}")
  print("JSON " + json.dumps(results))


if __name__ == "__main__":
  cli.run_tool(main, "compare_strategies.py", "gin/mnist.gin")
