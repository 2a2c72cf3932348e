"""What a shuffle costs in a checkpoint: input state, save and restore times.

For each shuffle size (`--sizes`, elements), side by side in one process:

  buffer          `shuffle(size)` over images held in memory (what TensorFlow's
                  guides teach): the iterator's checkpoint holds the buffer;
  global shuffle  the same images through a global shuffle of their indices
                  (tf.data's random-access path, `global_shuffle_op`, private
                  in TensorFlow 2.20) with symbolic checkpointing: the
                  iterator's checkpoint holds a few counters.

Each reads `--steps` batches of `--batch` images of `--image_side` squared by
3 uint8 values, saves its iterator with `tf.train.Checkpoint` to a temporary
directory (the state's bytes measured as a run measures them,
`trainer.data.input_state.checkpoint_bytes`), restores it into a fresh
iterator and checks that the restored iterator gives the same next batch.
Save and restore times are medians of `--repeats`.

Usage, from the repository root:
  python scripts/benchmark_resume.py [--sizes=1000,10000,100000]

The last line is `JSON {...}` with the figures.
"""

# local-paths-only: checkpoints go to a temporary folder it makes and
# removes; nothing else but this repository

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
# The random-access path; `Dataset.global_shuffle` is not public in 2.20.
from tensorflow.python.data.experimental.ops import global_shuffle_op

from trainer.data import input_state
from trainer.report import usage

flags.DEFINE_list("sizes", ["1000", "10000", "100000"],
                  "Shuffle sizes, in elements.")
flags.DEFINE_integer("image_side", 32, "Side of the square images.")
flags.DEFINE_integer("batch", 64, "Images per batch.")
flags.DEFINE_integer("steps", 20, "Batches read before the save.")
flags.DEFINE_integer("repeats", 3, "Saves and restores timed per case.")
FLAGS = flags.FLAGS


def _buffer(images: tf.Tensor, size: int) -> tf.data.Dataset:
  return (tf.data.Dataset.from_tensor_slices(images)
          .shuffle(size, seed=1, reshuffle_each_iteration=True)
          .repeat().batch(FLAGS.batch))


def _global(images: tf.Tensor, size: int) -> tf.data.Dataset:
  del size  # The whole set is the shuffle.
  indices = global_shuffle_op._global_shuffle(  # pylint: disable=protected-access
      tf.data.Dataset.range(int(images.shape[0])), seed=1,
      reshuffle_each_iteration=True)
  dataset = indices.repeat().batch(FLAGS.batch).map(
      lambda index: tf.gather(images, index))
  options = tf.data.Options()
  options.experimental_symbolic_checkpoint = True
  return dataset.with_options(options)


def _measure(build, images, size, directory):
  """Bytes, median save and restore seconds, and whether the restored
  iterator gives the same next batch."""
  iterator = iter(build(images, size))
  for _ in range(FLAGS.steps):
    next(iterator)
  checkpoint = tf.train.Checkpoint(iterator=iterator)
  saves, restores = [], []
  for repeat in range(FLAGS.repeats):
    start = time.perf_counter()
    prefix = checkpoint.write(os.path.join(directory, f"ckpt-{repeat}"))
    saves.append(time.perf_counter() - start)
    fresh = iter(build(images, size))
    start = time.perf_counter()
    tf.train.Checkpoint(iterator=fresh).read(prefix).assert_consumed()
    restores.append(time.perf_counter() - start)
  expected = next(iterator).numpy()
  same = bool(np.array_equal(next(fresh).numpy(), expected))
  return {"bytes": input_state.checkpoint_bytes(prefix),
          "save_s": statistics.median(saves),
          "restore_s": statistics.median(restores), "same_next_batch": same}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # TensorFlow's per-save INFO lines.
  rows = []
  side = FLAGS.image_side
  print(f"{'shuffle':>8}  {'way':<15} {'input state':>12} {'save s':>8} "
        f"{'restore s':>9}  same next batch")
  for size in map(int, FLAGS.sizes):
    images = tf.cast(tf.random.stateless_uniform(
        [size, side, side, 3], [0, 1], 0, 256, tf.int32), tf.uint8)
    for way, build in (("buffer", _buffer), ("global shuffle", _global)):
      with tempfile.TemporaryDirectory() as directory:
        row = dict(shuffle=size, way=way,
                   **_measure(build, images, size, directory))
      rows.append(row)
      print(f"{size:>8}  {way:<15} "
            f"{input_state.format_bytes(row['bytes']):>12} "
            f"{row['save_s']:>8.3f} {row['restore_s']:>9.3f}  "
            f"{'yes' if row['same_next_batch'] else 'NO'}", flush=True)
  print("JSON " + json.dumps({"image": [side, side, 3], "rows": rows}))


if __name__ == "__main__":
  usage.exit_if_requested(sys.argv, __doc__)
  app.run(main)
