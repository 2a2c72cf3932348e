"""What the shipped classifiers share: the loss and metric, and reading
images from tensorflow-datasets or TFRecord files.

`ClassificationTask`: sparse categorical crossentropy on logits and an
`accuracy` metric; the optimizer comes from gin (`optimizer.*`,
`learning_rate.*`). `DatasetClassificationTask` adds the data: a tfds dataset
by default, or the files of a `TFRecordSource` bound in gin; a split that
fits in memory is read once and then served from memory.
`ImageClassificationTask` decodes the images of TFRecord files.
"""

from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow as tf
import tf_keras

import trainer
from tasks import tfds_inputs
from tasks import tfrecord_inputs
from trainer import errors
from trainer.data import data_loss
from trainer.data import inputs

AUTOTUNE = tf.data.AUTOTUNE


class ClassificationTask(trainer.Task):
  """Classifies `(features, integer label)` examples from logits."""

  def build_losses(self, labels, model_outputs, aux_losses=None):
    del aux_losses
    return tf_keras.losses.sparse_categorical_crossentropy(
        labels, model_outputs, from_logits=True)

  def build_metrics(self, training=True):
    del training
    return [tf_keras.metrics.SparseCategoricalAccuracy("accuracy")]


class DatasetClassificationTask(ClassificationTask):
  """Classifies the examples of a tfds dataset, or of TFRecord files.

  Subclasses set the class attributes and build the model. The examples are
  served from memory by default (`build_inputs`, `in_memory`), as indices
  that `preprocess_batch` turns into a batch with `gather`; a split too
  large for that overrides `build_inputs` to stream `read` instead.

  Attributes:
    tfds_name: The tensorflow-datasets name.
    train_split: The tfds training split.
    eval_split: The tfds evaluation split.
  """

  tfds_name: str = ""
  train_split: str = "train"
  eval_split: str = "test"

  def __init__(self, data_dir: Optional[str] = None,
               tfrecords: Optional[tfrecord_inputs.TFRecordSource] = None,
               shuffle_seed: int = 0):
    """Configures where the examples come from.

    Args:
      data_dir: Where tfds keeps the dataset (prepared beforehand; nothing
        is downloaded at training time). None is tfds's default.
      tfrecords: Read these TFRecord files instead of tfds.
      shuffle_seed: Seeds the training order (and augmentation): the same on
        every run, and resumed exactly after a restart.
    """
    self.data_dir = data_dir
    self.tfrecords = tfrecords
    self.shuffle_seed = shuffle_seed
    self._in_memory: Dict[tuple, Tuple[np.ndarray, np.ndarray]] = {}
    self._constants: Dict[bool, Tuple[tf.Tensor, tf.Tensor]] = {}

  def read(self, training: bool,
           input_context: Optional[tf.distribute.InputContext],
           decode: bool = True) -> tf.data.Dataset:
    """Returns this input pipeline's `(features, label)` examples, streamed.

    Args:
      training: The training split (files in a seeded random order) or the
        evaluation split.
      input_context: Which of how many input pipelines this is.
      decode: Turn a TFRecord feature into the task's features (`decode`)
        and tfds images into pixels; False keeps images encoded (to decode
        only a crop).
    """
    if self.tfrecords is not None:
      dataset = self.tfrecords.read(training, input_context,
                                    seed=self.shuffle_seed)
      if decode:
        dataset = dataset.map(
            lambda features, label: (self.decode(features), label),
            num_parallel_calls=AUTOTUNE)
      return dataset
    dataset = tfds_inputs.load_shard(
        self.tfds_name, self.train_split if training else self.eval_split,
        data_dir=self.data_dir, input_context=input_context,
        shuffle_files=training, shuffle_seed=self.shuffle_seed,
        decode_images=decode)
    return dataset.map(lambda features, label: (features,
                                                tf.cast(label, tf.int32)))

  def stream(self, training: bool,
             input_context: Optional[tf.distribute.InputContext],
             window: int, decode: bool = True) -> tf.data.Dataset:
    """Returns this input pipeline's `(features, label)` examples streamed
    from the record files with `trainer.data.streaming` (a split too large
    for memory): training ones endlessly, each epoch's files in a stateless
    order, shuffled within windows of `window` examples, so the iterator's
    checkpoint holds positions, not examples; evaluation ones once, in
    order.

    Args:
      training: The training split or the evaluation split.
      input_context: Which of how many input pipelines this is.
      window: Examples per shuffle window (training).
      decode: As for `read`.
    """
    if self.tfrecords is not None:
      dataset = self.tfrecords.stream(training, input_context,
                                      seed=self.shuffle_seed, window=window)
      if decode:
        dataset = dataset.map(
            lambda features, label: (self.decode(features), label),
            num_parallel_calls=AUTOTUNE)
      return dataset
    return tfds_inputs.stream_shard(
        self.tfds_name, self.train_split if training else self.eval_split,
        data_dir=self.data_dir, input_context=input_context,
        training=training, seed=self.shuffle_seed, window=window,
        decode_images=decode)

  def build_inputs(self, training: bool,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> tf.data.Dataset:
    """Returns the split held in memory, as indices (see `in_memory`)."""
    return self.in_memory(training, input_context)

  def decode(self, features: tf.Tensor) -> tf.Tensor:
    """Turns a TFRecord file's feature into the task's input; unchanged by
    default."""
    return features

  def in_memory(self, training: bool,
                input_context: Optional[tf.distribute.InputContext]
                ) -> tf.data.Dataset:
    """Returns this input pipeline's example indices into the split held in
    memory; training ones endlessly, in a seeded order drawn anew every
    epoch.

    The split is read and decoded once per task; `gather` turns a batch of
    indices into features and labels (in `preprocess_batch`, one op per
    batch). Shuffling indices also keeps the data out of the checkpoint: a
    `cache()` or a shuffle buffer of examples is saved whole in every
    checkpoint holding the iterator (13 MB for 8 MB of data, measured).
    Training indices come endlessly (`inputs.shuffled_indices`), each epoch
    a stateless permutation, batched by a counter without a per-index cost;
    an evaluation's are one block (`inputs.examples_from_blocks`).
    """
    count = len(self._load(training, input_context)[1])
    if not count:
      return tf.data.Dataset.range(0)
    if not training:
      return inputs.examples_from_blocks(
          tf.data.Dataset.from_tensors(tf.range(count, dtype=tf.int64)))
    # Endless: epoch e's order depends on (shuffle_seed, e) alone, and the
    # framework batches it by a counter, all the iterator's state.
    return inputs.shuffled_indices(count, self.shuffle_seed)

  def gather(self, indices: tf.Tensor, training: bool
             ) -> Tuple[tf.Tensor, tf.Tensor]:
    """Returns the features and int32 labels at `indices` of the split
    `in_memory` loaded last; the framework traces `preprocess_batch` right
    after `build_inputs`, so each pipeline gathers from its own part."""
    features, labels = self._constants[training]
    return tf.gather(features, indices), tf.gather(labels, indices)

  def _load(self, training: bool,
            input_context: Optional[tf.distribute.InputContext]
            ) -> Tuple[np.ndarray, np.ndarray]:
    """Reads and decodes this input pipeline's part of a split, once."""
    key = (training, input_context.num_input_pipelines if input_context
           else 1, input_context.input_pipeline_id if input_context else 0)
    if key not in self._in_memory:
      dataset = self.read(training, input_context)
      try:
        batches = list(dataset.batch(4096).prefetch(2).as_numpy_iterator())
      except tf.errors.DataLossError as e:
        raise errors.RunError(data_loss.describe(e, dataset)) from e
      if batches:
        self._in_memory[key] = tuple(
            np.concatenate(parts) for parts in zip(*batches))
      else:
        self._in_memory[key] = tuple(
            np.zeros([0] + spec.shape.as_list(), spec.dtype.as_numpy_dtype)
            for spec in dataset.element_spec)
    self._constants[training] = tuple(
        tf.constant(array) for array in self._in_memory[key])
    return self._in_memory[key]


class ImageClassificationTask(DatasetClassificationTask):
  """Classifies images of a tfds dataset, or of TFRecord files.

  Attributes:
    image_shape: `(height, width, channels)`; None for sizes that vary.
  """

  image_shape: Tuple[Optional[int], Optional[int], int] = (None, None, 3)

  def decode(self, features: tf.Tensor) -> tf.Tensor:
    """Decodes an encoded image, or shapes numbers into `image_shape`."""
    if features.dtype == tf.string:
      image = tf.io.decode_image(features, channels=self.image_shape[-1],
                                 expand_animations=False)
      return tf.ensure_shape(image, self.image_shape)
    return tf.cast(tf.reshape(features, self.image_shape), tf.uint8)
