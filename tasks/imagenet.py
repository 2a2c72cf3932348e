"""`ImageNetResNet50`: ResNet-50 on ImageNet with the standard recipe.

The backbone and classification head are Model Garden's
(`official.vision.modeling`). Training images get an Inception-style random
crop (8% to 100% of the area, aspect ratio 3/4 to 4/3; only the crop is
decoded) and a random flip, evaluation images the central 87.5% square; both
are resized and normalised with ImageNet's channel statistics. The loss is
crossentropy with label smoothing, plus L2 weight decay on the kernels. The
learning rate and its warm-up come from gin (`gin/imagenet_resnet50.gin`).
"""

from typing import Optional

import gin
import tensorflow as tf
import tf_keras
from official.vision.modeling import backbones
from official.vision.modeling import classification_model

from tasks import classification
from tasks import image_inputs
from tasks import tfrecord_inputs


@gin.configurable
class ImageNetResNet50(classification.ImageClassificationTask):
  """ResNet-50 classifying tfds `imagenet2012` (or ImageNet TFRecords).

  The data streams from the record files (it does not fit in memory) through
  `trainer.data.streaming`: each epoch's files in a new stateless order, read
  in turn by an interleave, the encoded images shuffled
  within windows, decoded and augmented in parallel with per-example
  stateless seeds. The iterator's checkpoint holds positions and counters
  (kilobytes), not images, so a preempted run resumes where it was.
  """

  tfds_name = "imagenet2012"
  eval_split = "validation"
  image_shape = (None, None, 3)

  def __init__(self, data_dir: Optional[str] = None,
               tfrecords: Optional[tfrecord_inputs.TFRecordSource] = None,
               shuffle_seed: int = 0, image_size: int = 224,
               num_classes: int = 1000, label_smoothing: float = 0.1,
               weight_decay: float = 1e-4, use_sync_bn: bool = False,
               shuffle_window: int = 10000):
    """Configures the task.

    Args:
      data_dir: Where tfds keeps `imagenet2012` (prepared beforehand).
      tfrecords: Read these TFRecord files of JPEG images instead of tfds.
      shuffle_seed: Seeds the file and example order and the augmentation.
      image_size: Side of the square images the model sees.
      num_classes: Classes of the head.
      label_smoothing: Of the crossentropy's one-hot targets.
      weight_decay: L2 weight decay of the kernels (as the regulariser
        `l2(weight_decay / 2)`, which gives the classic decay).
      use_sync_bn: Synchronise batch-norm statistics across replicas (the
        same update on any replica count; slower).
      shuffle_window: Encoded images per training shuffle window (each
        moves at most this many places; none is kept in a checkpoint).
    """
    super().__init__(data_dir=data_dir, tfrecords=tfrecords,
                     shuffle_seed=shuffle_seed)
    self.image_size = image_size
    self.num_classes = num_classes
    self.label_smoothing = label_smoothing
    self.weight_decay = weight_decay
    self.use_sync_bn = use_sync_bn
    self.shuffle_window = shuffle_window

  def build_model(self) -> tf_keras.Model:
    input_specs = tf_keras.layers.InputSpec(
        shape=[None, self.image_size, self.image_size, 3])
    regularizer = (tf_keras.regularizers.l2(self.weight_decay / 2.0)
                   if self.weight_decay else None)
    backbone = backbones.ResNet(
        model_id=50, input_specs=input_specs, use_sync_bn=self.use_sync_bn,
        norm_momentum=0.9, norm_epsilon=1e-5,
        kernel_regularizer=regularizer)
    return classification_model.ClassificationModel(
        backbone=backbone, num_classes=self.num_classes,
        input_specs=input_specs, kernel_regularizer=regularizer)

  def build_inputs(self, training, input_context=None) -> tf.data.Dataset:
    examples = self.stream(training, input_context, self.shuffle_window,
                           decode=False)
    if training:
      return image_inputs.augment_forever(
          examples, self.shuffle_seed,
          lambda encoded, label, seed: (image_inputs.normalize(
              image_inputs.decode_random_crop(encoded, seed,
                                              self.image_size)), label))
    return examples.map(
        lambda encoded, label: (image_inputs.normalize(
            image_inputs.decode_center_crop(encoded, self.image_size)),
                                label),
        num_parallel_calls=tf.data.AUTOTUNE)

  def build_losses(self, labels, model_outputs, aux_losses=None):
    del aux_losses
    targets = tf.one_hot(labels, self.num_classes)
    return tf_keras.losses.categorical_crossentropy(
        targets, model_outputs, from_logits=True,
        label_smoothing=self.label_smoothing)

  def build_metrics(self, training=True):
    del training
    return [tf_keras.metrics.SparseCategoricalAccuracy("accuracy"),
            tf_keras.metrics.SparseTopKCategoricalAccuracy(
                5, name="top_5_accuracy")]
