"""What the first-step loss-scaling check (`trainer.model.loss_scaling`) costs.

A new run on several replicas of a Task with its own `train_step` runs its
first step alone, in a function of its own with the reference forward pass
before it (so the step is traced twice), and then the loop's other steps.
This times, in one process, a whole short run (`experiment.run`, `--steps`
steps in one loop, no evaluation) with
`trainer.check_loss_scaling` on and off, alternating over `--rounds` rounds,
for two models with a correct own `train_step`:

  mlp     the documentation's regression Task (Dense 16, tanh, Dense 1).
  resnet  a ResNet-18 from `official.vision` (batch normalisation) on
          32x32x3 random images, 10 classes.

The runs include everything a user waits for (building the model, tracing,
the steps, the checkpoint); the check adds to the first loop only. Printed
per model: the median seconds of each, the median over rounds of the ratio
within a round, and the median extra seconds.

Usage, from the repository root:
  python scripts/benchmark_loss_check.py [--rounds=5] [--steps=10]
      [--num_cpu_devices=2]

The last line printed is `JSON {...}` with those figures.
"""

# local-paths-only: its runs write to temporary folders it makes, their output
# to os.devnull; nothing else but this repository

import json
import os
import statistics
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402  Selects Keras 2 before TensorFlow loads.
from absl import app
from absl import flags
import tensorflow as tf
import tf_keras
from official.vision.modeling import backbones

from trainer import console
from trainer import experiment
from trainer.report import usage

_ROUNDS = flags.DEFINE_integer("rounds", 5, "Rounds of one run each way.")
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per run (one loop).")
_DEVICES = flags.DEFINE_integer("num_cpu_devices", 2,
                                "Logical CPU replicas (at least 2).")


class _OwnStep(trainer.Task):
  """A correct own `train_step` (the loss over the GLOBAL batch)."""

  def build_losses(self, labels, model_outputs, aux_losses=None):
    raise NotImplementedError

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    with tf.GradientTape() as tape:
      outputs = trainer.float32_outputs(model(features, training=True))
      loss = tf.nn.compute_average_loss(self.build_losses(labels, outputs))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return {"loss": loss}


class Mlp(_OwnStep):
  """The documentation's regression Task."""

  def build_model(self):
    return tf_keras.Sequential([tf_keras.Input((4,)),
                                tf_keras.layers.Dense(16, "tanh"),
                                tf_keras.layers.Dense(1)])

  def build_inputs(self, training, input_context=None):
    x = tf.random.stateless_normal([256, 4], seed=[0, int(training)])
    return tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, 1, True)))

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.reduce_mean(tf.square(labels - model_outputs), axis=-1)


class ResNet(_OwnStep):
  """ResNet-18 on 32x32 images."""

  def build_model(self):
    inputs = tf_keras.Input((32, 32, 3))
    backbone = backbones.ResNet(
        model_id=18, input_specs=tf_keras.layers.InputSpec(
            shape=[None, 32, 32, 3]))
    features = backbone(inputs)
    pooled = tf_keras.layers.GlobalAveragePooling2D()(
        features[max(features)])
    return tf_keras.Model(inputs, tf_keras.layers.Dense(10)(pooled))

  def build_inputs(self, training, input_context=None):
    images = tf.random.stateless_uniform([64, 32, 32, 3], seed=[1, 2])
    labels = tf.random.stateless_uniform([64], seed=[3, 4], maxval=10,
                                         dtype=tf.int32)
    return tf.data.Dataset.from_tensor_slices((images, labels))

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf_keras.losses.sparse_categorical_crossentropy(
        labels, model_outputs, from_logits=True)


def _run_seconds(task: trainer.Task, check: bool, batch: int) -> float:
  """Seconds of one new run of `task`."""
  runtime = trainer.RuntimeConfig(distribution_strategy="mirrored",
                                  num_cpu_devices=_DEVICES.value, seed=0)
  config = trainer.TrainerConfig(
      train_steps=_STEPS.value, steps_per_loop=_STEPS.value,
      summary_interval=_STEPS.value, checkpoint_interval=_STEPS.value,
      global_batch_size=batch, check_loss_scaling=check)
  with tempfile.TemporaryDirectory() as model_dir:
    start = time.perf_counter()
    experiment.run(task, "train", model_dir, runtime, config)
    return time.perf_counter() - start


def main(argv):
  del argv
  # Its table only, whatever `--verbosity` says.
  console.configure(verbosity_asked=False, errors_only=True)
  results = {}
  with open(os.devnull, "w", encoding="utf-8") as devnull:
    for name, task, batch in (("mlp", Mlp(), 32), ("resnet", ResNet(), 16)):
      times = {True: [], False: []}
      stdout, sys.stdout = sys.stdout, devnull  # The runs' own lines.
      try:
        _run_seconds(task, False, batch)  # Warm-up: TensorFlow's first run.
        for index in range(_ROUNDS.value):
          for check in (True, False) if index % 2 else (False, True):
            times[check].append(_run_seconds(task, check, batch))
      finally:
        sys.stdout = stdout
      ratio = statistics.median(on / off for on, off in zip(times[True],
                                                            times[False]))
      extra = statistics.median(on - off for on, off in zip(times[True],
                                                            times[False]))
      results[name] = {"check_s": statistics.median(times[True]),
                       "off_s": statistics.median(times[False]),
                       "ratio": ratio, "extra_s": extra}
      print(f"{name:6} | check on {results[name]['check_s']:6.2f} s | off "
            f"{results[name]['off_s']:6.2f} s | ratio {ratio:.3f} | extra "
            f"{extra:+.2f} s")
  print("JSON " + json.dumps(results))


if __name__ == "__main__":
  usage.exit_if_requested(sys.argv, __doc__)
  app.run(main)
