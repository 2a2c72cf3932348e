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

Then the resume time against the step (`--resume_steps`), for each of
`--workers` workers' input pipelines (worker i of n, built by the
framework's `DistributedInput` over the shipped digits Task, one process):

  skip            what `trainer.input_position = "skip"` does: a new
                  pipeline skips the step's batches, to its first batch;
  saved position  what several workers do by default
                  (`trainer.storage.worker_inputs`): a new pipeline's
                  iterator restored from the worker's position of the step,
                  to its first batch (the barrier at the save, an
                  all-reduce, is not part of a resume).

Both must give the batch the saved run read next; that is checked. Times
are medians of `--repeats`, the two ways timed in turns (the order
alternating).

Usage, from the repository root:
  python scripts/benchmark_resume.py [--sizes=1000,10000,100000]
      [--resume_steps=100,1000,10000] [--workers=2]

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

from tasks import digits
from trainer.data import input_state
from trainer.data import inputs
from trainer.report import usage
from trainer.storage import worker_inputs

flags.DEFINE_list("sizes", ["1000", "10000", "100000"],
                  "Shuffle sizes, in elements.")
flags.DEFINE_integer("image_side", 32, "Side of the square images.")
flags.DEFINE_integer("batch", 64, "Images per batch.")
flags.DEFINE_integer("steps", 20, "Batches read before the save.")
flags.DEFINE_integer("repeats", 3, "Saves and restores timed per case.")
flags.DEFINE_list("resume_steps", ["100", "1000", "10000"],
                  "Steps to resume at, for the resume times.")
flags.DEFINE_integer("workers", 2, "Workers' input pipelines resumed.")
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


@tf.function
def _advance(iterator, count):
  for _ in tf.range(count):
    next(iterator)


def _resume_times(step: int, worker: int, directory: str):
  """Seconds to the first batch of a resume at `step` of worker `worker`'s
  pipeline, by skip and by saved position, and whether both give the batch
  the saved run read next."""
  task = digits.DigitsClassification()
  # The worker's shard, batched by the framework as each worker batches it
  # for its replicas (one here).
  shard = tf.distribute.InputContext(FLAGS.workers, worker, FLAGS.workers)
  train_input = inputs.DistributedInput(
      tf.distribute.get_strategy(),
      lambda unused_context: task.build_inputs(True, shard), FLAGS.batch,
      training=True)
  holder = {"iterator": iter(train_input.build())}
  positions = worker_inputs.WorkerInputs(
      directory, FLAGS.workers, worker, lambda: holder["iterator"],
      lambda: None)
  _advance(holder["iterator"], tf.constant(step, tf.int64))
  positions.save(step)
  expected = next(holder["iterator"])[0].numpy()

  def skip():
    start = time.perf_counter()
    batch = next(iter(train_input.build().skip(step)))[0].numpy()
    return time.perf_counter() - start, batch

  def restore():
    start = time.perf_counter()
    holder["iterator"] = iter(train_input.build())
    assert positions.restore(step) is not None
    batch = next(holder["iterator"])[0].numpy()
    return time.perf_counter() - start, batch

  skip_s, position_s, same = [], [], True
  for repeat in range(FLAGS.repeats):
    # In turns, the order alternating: a slow spell slows both.
    ways = (skip, restore) if repeat % 2 == 0 else (restore, skip)
    timed = {way: way() for way in ways}
    skip_s.append(timed[skip][0])
    position_s.append(timed[restore][0])
    same = same and all(np.array_equal(batch, expected)
                        for _, batch in timed.values())
  return statistics.median(skip_s), statistics.median(position_s), same


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
  print()
  print(f"{'step':>8}  {'worker':>6} {'skip s':>8} {'position s':>10} "
        f"{'skip / position':>15}  same next batch")
  resumes = []
  for step in map(int, FLAGS.resume_steps):
    for worker in range(FLAGS.workers):
      with tempfile.TemporaryDirectory() as directory:
        skip_s, position_s, same = _resume_times(step, worker, directory)
      resumes.append(dict(step=step, worker=worker, skip_s=skip_s,
                          position_s=position_s, same_next_batch=same))
      print(f"{step:>8}  {worker:>6} {skip_s:>8.3f} {position_s:>10.3f} "
            f"{skip_s / position_s:>15.1f}  {'yes' if same else 'NO'}",
            flush=True)
  steps = [int(step) for step in FLAGS.resume_steps]
  flat = None
  if len(steps) > 1:
    def slowest(at):
      return max(row["position_s"] for row in resumes if row["step"] == at)
    flat = slowest(max(steps)) / slowest(min(steps))
    print(f"saved position: resume at step {max(steps)} over at step "
          f"{min(steps)}: {flat:.2f}x (slowest worker)")
  print("JSON " + json.dumps({"image": [side, side, 3], "rows": rows,
                              "resumes": resumes,
                              "position_last_over_first": flat}))


if __name__ == "__main__":
  usage.exit_if_requested(sys.argv, __doc__)
  app.run(main)
