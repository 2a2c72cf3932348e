"""Start-up: a finished 1-step digits run of train.py against a bare script.

Each run is a fresh process, timed from launch to exit, whose peak resident
memory and CPU time (user and system, all threads) are read from the kernel
(`os.wait4`'s `ru_maxrss`, `ru_utime` and `ru_stime`):

  ours   python train.py --gin_file=gin/digits.gin --mode=train
             --gin_param=trainer.train_steps=1 --model_dir=<fresh directory>
  bare   a script of TensorFlow and tf_keras alone (`BARE_SCRIPT`, written to
         a temporary file) that does what that run must: loads the same data
         (scikit-learn's digits, the same training split, shuffled and
         batched by 64), builds the same CNN as `tasks/digits.py` and
         Model Garden's Adam (legacy tf_keras Adam, rate 1e-3), traces and
         runs one train step in a `tf.function` and saves a
         `tf.train.Checkpoint` of the model and optimizer.

The two take turns over `--runs` pairs, the first of a pair alternating, so
a slow spell on a shared host slows both sides of a pair. Each run must exit
0 and leave a checkpoint; the bare model must have as many parameters as
the task's. Reported: the median seconds, CPU seconds and peak MiB of
each, and the ratios ours/bare: of seconds and CPU seconds, the median over
the pairs of the ratio within a pair; of memory, the ratio of the medians.
CPU time varies less than wall time on a busy host.

Target: ours <= 1.25x bare in seconds.

Usage, from the repository root:
  python scripts/benchmark_startup.py [--runs=5] [--train_py=OTHER/train.py]

The last line printed is `JSON {...}`: `seconds`, `cpu_seconds` and
`peak_mib` (medians per contender), `ratio`, `cpu_ratio` and `peak_ratio`
(ours/bare), `runs`, `target` and the 1-minute `load` average at the start.
"""

# local-paths-only: its runs write to temporary folders and files it makes;
# the train.py it times (--train_py) is a local script it executes

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("runs", 5, "Paired runs (ours, bare) to take the "
                     "median of.", lower_bound=1)
flags.DEFINE_string("train_py", None, "The train.py to time as ours (run "
                    "from its folder): another checkout's, to compare; "
                    "default this one's.")

CONTENDERS = ("ours", "bare")
TARGET = 1.25

# What a user would write without the framework; the model is
# tasks/digits.py's, the data its training split, the optimizer the one
# gin/digits.gin configures (Model Garden builds the legacy tf_keras Adam).
BARE_SCRIPT = '''\
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras
from sklearn import datasets

digits = datasets.load_digits()
order = np.random.RandomState(0).permutation(len(digits.target))[:1437]
images = (digits.images[order] / 16.0).astype(np.float32)[..., None]
labels = digits.target[order].astype(np.int32)
dataset = (tf.data.Dataset.from_tensor_slices((images, labels))
           .shuffle(len(labels), seed=0, reshuffle_each_iteration=True)
           .repeat().batch(64, drop_remainder=True).prefetch(tf.data.AUTOTUNE))

model = tf_keras.Sequential([
    tf_keras.Input((8, 8, 1)),
    tf_keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    tf_keras.layers.Conv2D(64, 3, activation="relu"),
    tf_keras.layers.MaxPooling2D(),
    tf_keras.layers.Flatten(),
    tf_keras.layers.Dense(128, activation="relu"),
    tf_keras.layers.Dense(10),
])
optimizer = tf_keras.optimizers.legacy.Adam(0.001)


@tf.function
def train_step(iterator):
  features, labels = next(iterator)
  with tf.GradientTape() as tape:
    logits = model(features, training=True)
    loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True))
  variables = model.trainable_variables
  optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
  return loss


loss = train_step(iter(dataset))
path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(
    os.path.join(sys.argv[1], "ckpt"))
print(f"bare | step 1 | loss {float(loss):.4f} | "
      f"{model.count_params()} parameters | saved {path}")
'''
# The digits CNN's parameters (filters 32, hidden units 128); checked by
# tests/scripts/test_benchmark_startup.py against the task's model.
PARAMETERS = 320 + 18496 + 73856 + 1290


def command(name: str, model_dir: str, bare_path: str,
            train_py: str) -> List[str]:
  """Returns the argv of contender `name` writing into `model_dir`."""
  if name == "ours":
    return [sys.executable, train_py,
            "--gin_file=gin/digits.gin", "--mode=train",
            "--gin_param=trainer.train_steps=1", f"--model_dir={model_dir}"]
  return [sys.executable, bare_path, model_dir]


def run_once(name: str, argv: List[str], model_dir: str,
             cwd: str = REPO_ROOT) -> Tuple[float, float, float]:
  """Runs `argv` to its exit; returns (seconds, peak MiB, CPU seconds).

  Raises:
    RuntimeError: If it fails or leaves no checkpoint in `model_dir`.
  """
  with tempfile.TemporaryFile("w+") as output:
    start = time.perf_counter()
    process = subprocess.Popen(argv, cwd=cwd, stdout=output,
                               stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    output.seek(0)
    text = output.read()
  if process.returncode:
    raise RuntimeError(f"{name} exited {process.returncode}:\n{text[-3000:]}")
  if not os.path.exists(os.path.join(model_dir, "checkpoint")):
    raise RuntimeError(f"{name} left no checkpoint in {model_dir}:\n"
                       f"{text[-3000:]}")
  if name == "bare" and f"| {PARAMETERS} parameters |" not in text:
    raise RuntimeError(f"bare's model has not {PARAMETERS} parameters:\n"
                       f"{text[-3000:]}")
  # ru_maxrss is in KiB on Linux.
  return seconds, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def benchmark(runs: int, root: str, train_py: str
              ) -> Dict[str, List[Tuple[float, float, float]]]:
  """Returns contender -> (seconds, peak MiB, CPU seconds) of each run, in
  pair order."""
  bare_path = os.path.join(root, "bare_digits.py")
  with open(bare_path, "w") as f:
    f.write(BARE_SCRIPT)
  results = {name: [] for name in CONTENDERS}
  for pair in range(runs):
    order = CONTENDERS if pair % 2 == 0 else CONTENDERS[::-1]
    for name in order:
      model_dir = os.path.join(root, f"{name}-{pair}")
      results[name].append(run_once(
          name, command(name, model_dir, bare_path, train_py), model_dir,
          cwd=os.path.dirname(train_py)))
  return results


def _median_ratio(values: Dict[str, List[float]]) -> float:
  """The median over the pairs of ours/bare within a pair."""
  return statistics.median(
      ours / bare for ours, bare in zip(values["ours"], values["bare"]))


def report(results: Dict[str, List[Tuple[float, float, float]]]
           ) -> Dict[str, object]:
  """Prints the table; returns the figures of the JSON line."""
  seconds, peaks, cpu = ({name: [run[i] for run in results[name]]
                          for name in CONTENDERS} for i in range(3))
  medians, peak_medians, cpu_medians = (
      {name: statistics.median(values[name]) for name in CONTENDERS}
      for values in (seconds, peaks, cpu))
  ratio, cpu_ratio = _median_ratio(seconds), _median_ratio(cpu)
  peak_ratio = peak_medians["ours"] / peak_medians["bare"]
  print(f"{'contender':<10}{'median':>9}{'min':>9}{'max':>9}{'cpu':>9}"
        f"{'peak':>9}  (seconds, CPU seconds, MiB)")
  for name in CONTENDERS:
    print(f"{name:<10}{medians[name]:9.2f}{min(seconds[name]):9.2f}"
          f"{max(seconds[name]):9.2f}{cpu_medians[name]:9.2f}"
          f"{peak_medians[name]:9.0f}")
  verdict = "PASS" if ratio <= TARGET else "FAIL"
  print(f"ours/bare {ratio:.3f}x seconds (median of pairs), {cpu_ratio:.3f}x "
        f"CPU seconds, {peak_ratio:.3f}x peak memory | target <= "
        f"{TARGET:.2f}x: {verdict}")
  return {"seconds": medians, "cpu_seconds": cpu_medians,
          "peak_mib": peak_medians, "ratio": ratio, "cpu_ratio": cpu_ratio,
          "peak_ratio": peak_ratio}


def main(argv):
  del argv
  load = os.getloadavg()[0]
  train_py = os.path.abspath(FLAGS.train_py or
                             os.path.join(REPO_ROOT, "train.py"))
  print(f"start-up of a 1-step digits run, {FLAGS.runs} pair(s) of fresh "
        f"processes, load {load:.2f}")
  if FLAGS.train_py:
    print(f"ours: {train_py}")
  with tempfile.TemporaryDirectory(prefix="startup-") as root:
    figures = report(benchmark(FLAGS.runs, root, train_py))
  figures.update(runs=FLAGS.runs, target=TARGET, load=load)
  print("JSON " + json.dumps(figures))


def _usage_module():
  """Returns trainer/report/usage.py, loaded alone: importing the `trainer`
  package would load TensorFlow into this process, which only waits."""
  spec = importlib.util.spec_from_file_location(
      "trainer_usage", os.path.join(REPO_ROOT, "trainer", "report", "usage.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


if __name__ == "__main__":
  _usage_module().exit_if_requested(sys.argv, __doc__)
  app.run(main)
