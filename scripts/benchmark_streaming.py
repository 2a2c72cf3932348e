"""Streaming with shuffle windows against a shuffle buffer, side by side.

Two comparisons, in one process, each on the same files:

  speed    the shipped ImageNet training input (`ImageNetResNet50`: encoded
           JPEGs, random crops decoded in parallel) on `--images` fake
           `imagenet2012` records, read two ways: `stream` as it ships
           (`trainer.data.streaming`: stateless file order, windows of
           `--window` encoded images, symbolic checkpointing) and `buffer`,
           the pipeline it replaced (tfds's reader, `shuffle(--window)` of
           encoded images). Each round times `--batches` batches of
           `--batch` from each (the order alternates between rounds); the
           ratio is the median of the rounds' ratios, so a slow spell on a
           shared host slows both sides. Each iterator's checkpoint is then
           written and its input state measured
           (`trainer.data.input_state.checkpoint_bytes`).
  quality  record files written class by class (`--classes` classes of
           `--per_class` records, each file a run of classes: the worst
           case, data stored as it was collected), read by
           `streaming.stream_files` (stateless file order) and shuffled by
           a window of `--window` (`streaming.shuffle_windows`, as
           `stream_files` does) or by `shuffle(--window)`.
           Per batch of `--batch`: the distinct classes (a uniform draw's
           expectation printed beside them), and how far an example travels
           from its place in the order the files gave it (mean and 99th
           percentile).

Usage, from the repository root:
  python scripts/benchmark_streaming.py [--window=10000] [--images=2048]

The last line is `JSON {...}` with the figures.
"""

# local-paths-only: fake data and checkpoints go to a temporary folder it
# makes and removes; nothing else but this repository

import json
import os
import statistics
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))  # local-path: this repository
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402,F401  Selects Keras 2 before TensorFlow loads.
from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from tasks import fake_data
from tasks import image_inputs
from tasks import imagenet
from trainer.data import input_state
from trainer.data import streaming
from trainer.report import usage

flags.DEFINE_integer("window", 10000, "Shuffle window and buffer, examples.")
flags.DEFINE_integer("images", 2048, "Fake imagenet2012 training images.")
flags.DEFINE_integer("image_size", 128, "Training crop side.")
flags.DEFINE_integer("batch", 64, "Examples per batch.")
flags.DEFINE_integer("batches", 40, "Batches timed per round and side.")
flags.DEFINE_integer("rounds", 7, "Timed rounds.")
flags.DEFINE_integer("classes", 100, "Classes of the quality files.")
flags.DEFINE_integer("per_class", 200, "Records per class.")
flags.DEFINE_integer("files", 20, "Quality files (each a run of classes).")
FLAGS = flags.FLAGS


def _buffered_imagenet(task: imagenet.ImageNetResNet50) -> tf.data.Dataset:
  """The ImageNet training input as it was before streaming: tfds's reader
  and a shuffle buffer of encoded images, then the same augmentation."""
  examples = task.read(True, None, decode=False).shuffle(
      task.shuffle_window, seed=task.shuffle_seed,
      reshuffle_each_iteration=True)
  return image_inputs.augment_forever(
      examples, task.shuffle_seed,
      lambda encoded, label, seed: (image_inputs.normalize(
          image_inputs.decode_random_crop(encoded, seed, task.image_size)),
                                    label))


def _time(iterator, batches: int) -> float:
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return time.perf_counter() - start


def _state_bytes(iterator, directory: str, name: str) -> int:
  prefix = tf.train.Checkpoint(iterator=iterator).write(
      os.path.join(directory, name))
  return input_state.checkpoint_bytes(prefix)


def speed(directory: str) -> dict:
  """Batches per second and input state of the two ImageNet pipelines."""
  data_dir = os.path.join(directory, "tfds")
  fake_data.write("imagenet2012", data_dir,
                  {"train": FLAGS.images, "validation": 8},
                  image_sizes=(160, 320))
  task = imagenet.ImageNetResNet50(data_dir=data_dir,
                                   image_size=FLAGS.image_size,
                                   shuffle_window=FLAGS.window)
  pipelines = {
      "stream": task.build_inputs(True),
      "buffer": _buffered_imagenet(task),
  }
  iterators, fill = {}, {}
  for name, dataset in pipelines.items():
    start = time.perf_counter()
    iterators[name] = iter(dataset.batch(FLAGS.batch, drop_remainder=True)
                           .prefetch(tf.data.AUTOTUNE))
    next(iterators[name])  # Fills the window or the buffer.
    fill[name] = time.perf_counter() - start
  rates = {name: [] for name in pipelines}
  ratios = []
  for round_ in range(FLAGS.rounds):
    order = list(pipelines) if round_ % 2 == 0 else list(pipelines)[::-1]
    seconds = {name: _time(iterators[name], FLAGS.batches) for name in order}
    for name in pipelines:
      rates[name].append(FLAGS.batches / seconds[name])
    ratios.append(seconds["buffer"] / seconds["stream"])
  return {
      "batches_per_s": {name: statistics.median(values)
                        for name, values in rates.items()},
      "stream_over_buffer": statistics.median(ratios),
      "first_batch_s": fill,
      "state_bytes": {name: _state_bytes(iterators[name], directory, name)
                      for name in pipelines},
  }


def _write_sorted_files(directory: str):
  """Files of `(id, class)` records, class after class; id = arrival in
  the sorted order."""
  count = FLAGS.classes * FLAGS.per_class
  per_file = -(-count // FLAGS.files)
  paths = []
  for start in range(0, count, per_file):
    path = os.path.join(directory, f"sorted-{len(paths):03d}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for index in range(start, min(start + per_file, count)):
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            "id": tf.train.Feature(int64_list=tf.train.Int64List(
                value=[index])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(
                value=[index // FLAGS.per_class])),
        })).SerializeToString())
    paths.append(path)
  return paths


def _parse(record):
  example = tf.io.parse_single_example(record, {
      "id": tf.io.FixedLenFeature([], tf.int64),
      "label": tf.io.FixedLenFeature([], tf.int64)})
  return example["id"], example["label"]


def _mixing(dataset: tf.data.Dataset, count: int) -> dict:
  """`dataset` of `(arrival position, label)`: the mixing of its first
  `count`."""
  arrived, labels = [], []
  for position, label in dataset.take(count).as_numpy_iterator():
    arrived.append(int(position))
    labels.append(int(label))
  travel = np.abs(np.arange(count) - np.array(arrived))
  per_batch = [len(set(labels[start:start + FLAGS.batch]))
               for start in range(0, count - FLAGS.batch + 1, FLAGS.batch)]
  return {"classes_per_batch": float(np.mean(per_batch)),
          "travel_mean": float(np.mean(travel)),
          "travel_p99": float(np.percentile(travel, 99))}


def quality(directory: str) -> dict:
  """How well the window and the buffer mix the same files' records."""
  paths = _write_sorted_files(directory)
  count = FLAGS.classes * FLAGS.per_class  # One epoch.
  # The records in the order the files give them (stateless file order, no
  # shuffle), each with its place in that order; then shuffled both ways.
  arrivals = streaming.stream_files(
      paths, tf.data.TFRecordDataset, training=True, seed=0, window=1,
      parse=_parse).enumerate().map(lambda position, example: (
          position, example[1]))
  uniform = FLAGS.classes * (1 - (1 - 1 / FLAGS.classes) ** FLAGS.batch)
  return {
      "window": _mixing(streaming.shuffle_windows(arrivals, FLAGS.window,
                                                  seed=0), count),
      "buffer": _mixing(arrivals.shuffle(FLAGS.window, seed=0), count),
      "uniform_classes_per_batch": uniform,
  }


def main(argv):
  del argv
  logging.set_verbosity(logging.ERROR)
  with tempfile.TemporaryDirectory() as directory:
    figures = {"window": FLAGS.window, "speed": speed(directory),
               "quality": quality(directory)}
  fast = figures["speed"]
  print(f"ImageNet input, {FLAGS.images} fake images, window/buffer "
        f"{FLAGS.window}, batch {FLAGS.batch}, crops of {FLAGS.image_size}:")
  print(f"  {'':8} {'batches/s':>10} {'first batch':>12} {'input state':>12}")
  for name in ("stream", "buffer"):
    print(f"  {name:8} {fast['batches_per_s'][name]:10.2f} "
          f"{fast['first_batch_s'][name]:11.2f}s "
          f"{input_state.format_bytes(fast['state_bytes'][name]):>12}")
  print(f"  stream / buffer speed: {fast['stream_over_buffer']:.3f}x "
        f"(median of {FLAGS.rounds} rounds)")
  mixed = figures["quality"]
  print(f"Mixing, {FLAGS.classes} classes x {FLAGS.per_class} records stored "
        f"class by class in {FLAGS.files} files, one epoch:")
  print(f"  {'':8} {'classes/batch':>14} {'travel mean':>12} "
        f"{'travel p99':>11}")
  for name in ("window", "buffer"):
    row = mixed[name]
    print(f"  {name:8} {row['classes_per_batch']:14.1f} "
          f"{row['travel_mean']:12.0f} {row['travel_p99']:11.0f}")
  print(f"  a uniform draw: {mixed['uniform_classes_per_batch']:.1f} classes "
        f"per batch of {FLAGS.batch}")
  print("JSON " + json.dumps(figures))


if __name__ == "__main__":
  usage.exit_if_requested(sys.argv, __doc__)
  app.run(main)
