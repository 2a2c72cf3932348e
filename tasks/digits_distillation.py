"""`DigitsDistillation`: a small student learns digits from a frozen teacher.

Two models, one optimizer: the teacher is the digits CNN, restored from a
`gin/digits.gin` run's checkpoint (`warm_start.model = "teacher"`) and
frozen (`trainable = False`, so it gets no optimizer and its weights stay
as trained); the student, a small MLP, learns from a mix of the labels and
the teacher's softened outputs (Hinton et al.'s distillation loss: the
KL divergence at `temperature`, scaled by its square, weighted
`1 - label_weight`). Evaluation reports the student's `accuracy` and the
teacher's (`teacher_accuracy`) on the same images.
"""

from typing import Dict, List, Optional

import gin
import tensorflow as tf
import tf_keras

import trainer
from tasks import digits
from trainer.data import inputs


@gin.configurable
class DigitsDistillation(trainer.Task):
  """A student MLP distilled from the digits CNN."""

  def __init__(self, student_units: int = 32, temperature: float = 4.0,
               label_weight: float = 0.1, shuffle_seed: int = 0):
    """Configures the task.

    Args:
      student_units: Width of the student's one hidden layer.
      temperature: Softens both models' outputs in the distillation loss.
      label_weight: The hard-label loss's share of the loss; the rest is
        the teacher's.
      shuffle_seed: Seeds the training order.
    """
    self.student_units = student_units
    self.temperature = temperature
    self.label_weight = label_weight
    self.shuffle_seed = shuffle_seed

  def build_model(self) -> Dict[str, tf_keras.Model]:
    teacher = digits.DigitsClassification().build_model()
    teacher.trainable = False
    student = tf_keras.Sequential([
        tf_keras.Input((8, 8, 1)),
        tf_keras.layers.Flatten(),
        tf_keras.layers.Dense(self.student_units, activation="relu",
                              name="student_hidden"),
        tf_keras.layers.Dense(digits.NUM_CLASSES, name="student_logits"),
    ], name="student")
    return {"teacher": teacher, "student": student}

  def build_inputs(self, training, input_context=None) -> tf.data.Dataset:
    return inputs.examples_from_arrays(digits.load_split(training), training,
                                       input_context, seed=self.shuffle_seed)

  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    return tf_keras.losses.sparse_categorical_crossentropy(
        labels, model_outputs, from_logits=True)

  def build_metrics(self, training: bool = True
                    ) -> List[tf_keras.metrics.Metric]:
    metrics = [tf_keras.metrics.SparseCategoricalAccuracy("accuracy")]
    if not training:
      metrics.append(
          tf_keras.metrics.SparseCategoricalAccuracy("teacher_accuracy"))
    return metrics

  def distillation_losses(self, labels, student_logits, teacher_logits):
    """Per-example: the label loss and the teacher's, mixed."""
    t = self.temperature
    soft_teacher = tf.nn.softmax(teacher_logits / t)
    soft = tf_keras.losses.kl_divergence(
        soft_teacher, tf.nn.softmax(student_logits / t)) * t * t
    hard = self.build_losses(labels, student_logits)
    return self.label_weight * hard + (1 - self.label_weight) * soft

  def train_step(self, inputs, model, optimizer,
                 metrics: Optional[List[tf_keras.metrics.Metric]] = None):
    images, labels = inputs
    teacher_logits = trainer.float32_outputs(
        model["teacher"](images, training=False))
    with tf.GradientTape() as tape:
      student_logits = trainer.float32_outputs(
          model["student"](images, training=True))
      loss = tf.nn.compute_average_loss(self.distillation_losses(
          labels, student_logits, teacher_logits))
    norm = trainer.minimize(tape, loss,
                            model["student"].trainable_variables,
                            optimizer["student"])
    for metric in metrics or []:
      metric.update_state(labels, student_logits)
    loss = tf.where(tf.math.is_finite(norm), loss, tf.constant(float("nan")))
    return {"loss": loss, "gradient_norm": norm}

  def validation_step(self, inputs, model,
                      metrics: Optional[List[tf_keras.metrics.Metric]] = None):
    images, labels = inputs
    student_logits = trainer.float32_outputs(
        model["student"](images, training=False))
    teacher_logits = trainer.float32_outputs(
        model["teacher"](images, training=False))
    if metrics:
      metrics[0].update_state(labels, student_logits)
      metrics[1].update_state(labels, teacher_logits)
    return {"loss": self.build_losses(labels, student_logits)}
