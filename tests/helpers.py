"""Shared test helpers: tiny tasks, checkpoint and event-file readers, CLI."""

import collections
import glob
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tf_keras
# pylint: disable-next=g-direct-tensorflow-import
from tensorflow.python.debug.lib import debug_events_reader

import trainer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(REPO_ROOT, "train.py")


class LinearRegression(trainer.Task):
  """y = x.w + noise on a fixed synthetic set; trained with plain SGD.

  SGD keeps the gradient scale visible in the weights (Adam would hide a
  wrong loss scaling).
  """

  def __init__(self, num_examples: int = 256, learning_rate: float = 0.1):
    self.num_examples = num_examples
    self.learning_rate = learning_rate

  def build_model(self):
    return tf_keras.Sequential([
        tf_keras.Input((4,)),
        tf_keras.layers.Dense(8, activation="tanh"),
        tf_keras.layers.Dense(1),
    ])

  def build_inputs(self, training, input_context=None):
    rng = np.random.RandomState(0 if training else 1)
    x = rng.normal(size=(self.num_examples, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32))[:, None]
    return tf.data.Dataset.from_tensor_slices((x, y))

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.reduce_mean(tf.square(labels - model_outputs), axis=-1)

  def build_metrics(self, training=True):
    return [tf_keras.metrics.MeanAbsoluteError("mae")]

  def create_optimizer(self, settings):
    del settings  # A task's own optimizer, instead of gin's `optimizer.*`.
    return tf_keras.optimizers.SGD(self.learning_rate)


class MixedRegression(LinearRegression):
  """`LinearRegression` trained on a mixture of two sources: "clean" and
  "shifted" (its targets 1 higher), each shuffled anew every epoch.

  Its metric is the mean target, so a mixture's share shows in it too.
  """

  def __init__(self, sizes=(192, 64), learning_rate: float = 0.05,
               rates=None):
    super().__init__(sizes[0], learning_rate)
    self.sizes = sizes
    self.rates = rates

  def _source(self, seed, size, shift):
    x = np.random.RandomState(seed).normal(size=(size, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32))[:, None] + shift
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        size, seed=seed, reshuffle_each_iteration=True)

  def build_inputs(self, training, input_context=None):
    if not training:
      return super().build_inputs(training, input_context)
    return {"clean": self._source(0, self.sizes[0], 0.0),
            "shifted": self._source(1, self.sizes[1], 1.0)}

  def mixture_rates(self):
    return self.rates


class ZeroMixedRegression(MixedRegression):
  """`MixedRegression` with zero weights that do not move (a 50/50 mixture
  by default): an example's loss is its target squared, so each source's
  mean loss is known by hand."""

  def __init__(self, rates=None):
    super().__init__(learning_rate=0.0,
                     rates=rates or {"clean": 0.5, "shifted": 0.5})

  def build_model(self):
    return tf_keras.Sequential([
        tf_keras.Input((4,)),
        tf_keras.layers.Dense(8, activation="tanh",
                              kernel_initializer="zeros"),
        tf_keras.layers.Dense(1, kernel_initializer="zeros"),
    ])


class ConfiguredRegression(LinearRegression):
  """`LinearRegression` with the optimizer gin configures (Model Garden's
  legacy optimizers through `optimizer.*` and `learning_rate.*`)."""

  create_optimizer = trainer.Task.create_optimizer


class PerReplicaMeanLinearRegression(LinearRegression):
  """The classic bug: the loss averaged over the per-replica batch."""

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(self.build_losses(labels, model(features)))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return {"loss": loss}


def source_losses(dataset: tf.data.Dataset, windows: Sequence[int],
                  names=("clean", "shifted")) -> List[Dict[str, float]]:
  """Each source's mean loss under `ZeroMixedRegression` (its targets
  squared) in each window of batches of a mixture's `dataset` (`windows`:
  the batches of each, in order)."""
  iterator, results = iter(dataset), []
  for steps in windows:
    losses, sources = [], []
    for _ in range(steps):
      (_, labels), index = next(iterator)
      losses.append(np.square(labels.numpy()[:, 0].astype(np.float64)))
      sources.append(index.numpy())
    losses, sources = np.concatenate(losses), np.concatenate(sources)
    results.append({name: float(losses[sources == index].mean())
                    for index, name in enumerate(names)})
  return results


def checkpoint_weights(model_dir: str) -> Dict[str, np.ndarray]:
  """Returns the model variables of the newest checkpoint in `model_dir`."""
  reader = tf.train.load_checkpoint(model_dir)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.startswith("model/") and "OPTIMIZER_SLOT" not in name}


def checkpoint_numbers(path: str) -> Dict[str, np.ndarray]:
  """Returns every numeric value of a checkpoint (prefix or directory): the
  model, optimizer slots and step counters; not the iterator's state."""
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name)
          for name, dtype in reader.get_variable_to_dtype_map().items()
          if dtype.is_floating or dtype.is_integer}


def assert_same_numbers(model_dir: str, reference_dir: str) -> None:
  """Asserts that the newest checkpoints of two runs hold the same numbers,
  bit for bit (weights, optimizer slots, counters), but for the count of
  saves, which differs by design between a resumed and a straight run."""
  ours = checkpoint_numbers(model_dir)
  reference = checkpoint_numbers(reference_dir)
  assert sorted(ours) == sorted(reference)
  for name in reference:
    if name != "save_counter/.ATTRIBUTES/VARIABLE_VALUE":
      np.testing.assert_array_equal(ours[name], reference[name],
                                    err_msg=name)


def checkpoint_step(model_dir: str) -> int:
  reader = tf.train.load_checkpoint(model_dir)
  return int(reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE"))


def kill_after_first_save(run: "TrainProcess", model_dir: str, seed: int,
                          spread: float, first: int = 20,
                          timeout: float = 120) -> int:
  """SIGKILLs `run` at a random moment (seeded) within `spread` seconds of
  its checkpoint of step `first` (awaited `timeout` seconds); returns the
  step of the newest checkpoint it left in `model_dir`, at least `first`."""
  import random  # pylint: disable=g-import-not-at-top
  try:
    run.wait_for(rf"saved checkpoint .*ckpt-{first}$", timeout=timeout)
    time.sleep(random.Random(seed).uniform(0.0, spread))
    run.process.kill()
  finally:
    run.close()
  saved = checkpoint_step(model_dir)
  assert saved >= first
  return saved


def latest_step(model_dir: str) -> int:
  """The newest checkpoint's number in `model_dir`'s state file; -1 if
  none (read while a run may be saving)."""
  state = tf.train.get_checkpoint_state(model_dir)
  if state is None:
    return -1
  return int(state.model_checkpoint_path.rsplit("-", 1)[1])


def max_weight_difference(a: Dict[str, np.ndarray],
                          b: Dict[str, np.ndarray]) -> float:
  assert sorted(a) == sorted(b)
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def read_scalars(log_dir: str) -> Dict[str, List[tuple]]:
  """Returns {tag: [(step, value), ...]} from every event file in `log_dir`
  (a local path or a URL)."""
  scalars = {}
  for path in sorted(tf.io.gfile.glob(
      os.path.join(log_dir, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name not in ("scalars", ""):
          continue
        number = float(tf.make_ndarray(value.tensor)) if value.HasField(
            "tensor") else value.simple_value
        scalars.setdefault(value.tag, []).append((event.step, number))
  return scalars


def read_tags(log_dir: str) -> set:
  """Returns every summary tag in the event files of `log_dir`."""
  tags = set()
  for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(value.tag for value in event.summary.value)
  return tags


def run_cli(args: Sequence[str], cwd: str = REPO_ROOT, timeout: float = 300,
            env: Optional[Dict[str, str]] = None
            ) -> subprocess.CompletedProcess:
  """Runs `python train.py ARGS` (with `env` added) and returns the finished
  process."""
  env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
  return subprocess.run([sys.executable, TRAIN_PY, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=timeout)


def final_accuracy(stdout: str) -> float:
  """The accuracy on a run's `final eval |` line."""
  return float(stdout.split("final eval |")[1].split("accuracy ")[1].split()[0])


# Serves a digits SavedModel in a fresh process of one device: argv is the
# export directory and the repository root.
_SERVE_DIGITS = """
import sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, sys.argv[2])
from tasks import digits
images, labels = digits.load_split(training=False)
served = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
logits = served(features=tf.constant(images))["outputs"].numpy()
print("devices", len(tf.config.list_logical_devices("CPU")))
print("accuracy", float(np.mean(np.argmax(logits, -1) == labels)))
"""


def serve_digits_export(export_dir: str) -> subprocess.CompletedProcess:
  """Serves the digits SavedModel in `export_dir` on the validation split in
  a new process of one CPU device; it prints `devices N` and `accuracy A`."""
  return subprocess.run(
      [sys.executable, "-c", _SERVE_DIGITS, str(export_dir), REPO_ROOT],
      capture_output=True, text=True, timeout=120,
      env=dict(os.environ, TF_USE_LEGACY_KERAS="1"))


def executed_ops(dump_dir: str) -> Dict[tuple, int]:
  """(op type, device) -> how often TensorFlow executed it in a graph, read
  from a `tf.debugging.experimental.enable_dump_debug_info` dump."""
  counts = collections.Counter()
  with debug_events_reader.DebugDataReader(str(dump_dir)) as reader:
    reader.update()
    for trace in reader.graph_execution_traces():
      counts[(trace.op_type, trace.device_name)] += 1
  return counts


def while_body_ops(function) -> collections.Counter:
  """Op type -> count in the body of the one `tf.while_loop` of a traced
  `function` (a `ConcreteFunction`), the function calls inside it (a
  replica step, a Keras layer) expanded: what the loop runs every step."""
  graph_def = function.graph.as_graph_def()
  library = {f.signature.name: f for f in graph_def.library.function}

  def count(nodes, counts):
    for node in nodes:
      called = node.op if node.op in library else next(
          (node.attr[key].func.name for key in ("f",)
           if key in node.attr and node.attr[key].func.name in library),
          None)
      if called:
        count(library[called].node_def, counts)
      else:
        counts[node.op] += 1
    return counts

  (loop,) = [node for node in graph_def.node
             if node.op in ("While", "StatelessWhile")]
  return count(library[loop.attr["body"].func.name].node_def,
               collections.Counter())


def snapshot(directory: str) -> Dict[str, bytes]:
  """Returns {relative path: content} for every file under `directory`."""
  files = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, directory)] = f.read()
  return files


def page_commands(page: str, script: str) -> List[List[str]]:
  """The arguments of each `python scripts/SCRIPT ...` line of docs/PAGE
  (a comment for the reader left out), in the page's order."""
  with open(os.path.join(REPO_ROOT, "docs", page), encoding="utf-8") as f:
    lines = re.findall(rf"^python (scripts/{re.escape(script)}\b.*)$",
                       f.read(), re.M)
  return [line.split("#")[0].split() for line in lines]


def page_command(page: str, script: str, containing: str = "") -> List[str]:
  """The arguments of docs/PAGE's one `python scripts/SCRIPT ...` line (the
  one containing `containing`); fails unless there is exactly one."""
  found = [command for command in page_commands(page, script)
           if containing in " ".join(command)]
  assert len(found) == 1, (page, script, containing, found)
  return found[0]


def free_ports(count: int) -> List[int]:
  """Returns `count` TCP ports free on 127.0.0.1 right now."""
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def finish(processes: Sequence[subprocess.Popen], timeout: float = 240
           ) -> List[tuple]:
  """Waits for each of `processes` (started with pipes) for up to `timeout`
  seconds; returns `(returncode, stdout, stderr)` of each. Whatever still
  runs at the end, a timeout included, is killed."""
  outputs = []
  try:
    for process in processes:
      stdout, stderr = process.communicate(timeout=timeout)
      outputs.append((process.returncode, stdout, stderr))
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
        process.communicate()
  return outputs


class TrainProcess:
  """`python train.py ARGS` in the background, its stdout read as it comes.

  Always `close()` it (it kills the process if still running).
  """

  def __init__(self, args: Sequence[str], env: Optional[Dict[str, str]] = None,
               cwd: str = REPO_ROOT):
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    self.process = subprocess.Popen(
        [sys.executable, TRAIN_PY, *args], cwd=cwd, env=full_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self.lines: List[str] = []
    self._stderr_lines: List[str] = []
    self._readers = [
        threading.Thread(target=self._read, daemon=True,
                         args=(self.process.stdout, self.lines)),
        threading.Thread(target=self._read, daemon=True,
                         args=(self.process.stderr, self._stderr_lines))]
    for reader in self._readers:
      reader.start()

  @staticmethod
  def _read(stream, lines: List[str]) -> None:
    for line in stream:
      lines.append(line.rstrip("\n"))

  def wait_for(self, pattern: str, timeout: float = 120.0) -> re.Match:
    """Returns the first stdout line matching `pattern`, waiting for it."""
    deadline = time.time() + timeout
    seen = 0
    while time.time() < deadline:
      for line in self.lines[seen:]:
        found = re.search(pattern, line)
        if found:
          return found
      seen = len(self.lines)
      if self.process.poll() is not None and not self._readers[0].is_alive():
        break
      time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r}; last lines: "
                         f"{self.lines[-5:]}")

  def finish(self, timeout: float = 120.0) -> int:
    """Waits for the exit; returns the exit code."""
    try:
      self.process.wait(timeout=timeout)
    finally:
      self.close()
    return self.process.returncode

  def close(self) -> None:
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait()
    for reader in self._readers:
      reader.join(timeout=10)

  @property
  def output(self) -> str:
    return "\n".join(self.lines)

  @property
  def stderr(self) -> str:
    return "\n".join(self._stderr_lines)


def flip_tensor(prefix, name):
  """Flips 64 bytes in the middle of tensor `name`'s bytes in the data file
  (found by its value: the test fails if that value is there twice).

  Returns:
    The damaged file's bytes.
  """
  raw = tf.train.load_checkpoint(prefix).get_tensor(name).tobytes()
  path = prefix + ".data-00000-of-00001"
  with open(path, "rb") as f:
    data = bytearray(f.read())
  start = data.find(raw)
  assert start >= 0 and data.find(raw, start + 1) == -1
  middle = start + (len(raw) - 64) // 2
  for i in range(middle, middle + 64):
    data[i] ^= 0xFF
  with open(path, "wb") as f:
    f.write(data)
  return bytes(data)


def write_image_records(directory, num_files, per_file, offset=1):
  """Writes PNG-encoded 28x28 images with labels `i % 10 + offset`."""
  os.makedirs(directory, exist_ok=True)
  rng = np.random.RandomState(0)
  index = 0
  for shard in range(num_files):
    path = os.path.join(directory, f"data-{shard:02d}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(per_file):
        image = rng.randint(0, 256, (28, 28, 1)).astype(np.uint8)
        example = tf.train.Example(features=tf.train.Features(feature={
            "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[tf.io.encode_png(image).numpy()])),
            "image/class/label": tf.train.Feature(int64_list=(
                tf.train.Int64List(value=[index % 10 + offset]))),
        }))
        writer.write(example.SerializeToString())
        index += 1
  return os.path.join(directory, "data-*.tfrecord")
