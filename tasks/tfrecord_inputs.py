"""Reading classification examples from TFRecord files the user already has.

A `TFRecordSource`, configured in gin, names the files and the
`tf.train.Example` schema; the shipped image tasks read it instead of
tensorflow-datasets when it is bound:

    Cifar10Classification.tfrecords = @TFRecordSource()
    TFRecordSource.train_files = "/data/cifar10/train-*.tfrecord"
    TFRecordSource.eval_files = "/data/cifar10/test-*.tfrecord"
    TFRecordSource.schema = {"image": "string", "label": "int64"}

The pipeline follows the usual recipe for record files: files listed (in a
seeded random order for training), sharded by file across input pipelines
(by example when there are fewer files than pipelines), read with a parallel
interleave, and parsed with a parallel map. `stream` reads them through
`trainer.data.streaming` instead: shuffled within windows, resumable from an
iterator state of kilobytes.
"""

import dataclasses
import re
from typing import Mapping, Optional

import gin
import tensorflow as tf

from trainer import errors
from trainer.data import streaming
from trainer.storage import files

AUTOTUNE = tf.data.AUTOTUNE
DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
_SPEC = re.compile(r"^(string|int64|float32)(?:\[(\d+(?:,\d+)*)\])?$")


def parse_schema(schema: Mapping[str, str]
                 ) -> Mapping[str, tf.io.FixedLenFeature]:
  """Turns `{"name": "dtype[shape]"}` into `tf.io.parse_example` features.

  `dtype` is string, int64 or float32; `[shape]` (e.g. `float32[28,28]`) is
  omitted for a scalar.

  Raises:
    errors.ConfigError: For a malformed entry.
  """
  features = {}
  for name, spec in schema.items():
    match = _SPEC.match(str(spec).replace(" ", ""))
    if not match:
      raise errors.ConfigError(
          f"`TFRecordSource.schema` entry {name!r}: {spec!r} is not "
          "'string', 'int64' or 'float32', optionally with a shape such as "
          "'float32[28,28]'.")
    shape = [int(d) for d in match.group(2).split(",")] if match.group(
        2) else []
    features[name] = tf.io.FixedLenFeature(shape, DTYPES[match.group(1)])
  return features


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TFRecordSource:
  """Classification examples in TFRecord files of `tf.train.Example`s.

  Attributes:
    train_files: Glob pattern of the training files.
    eval_files: Glob pattern of the evaluation files.
    schema: Feature name -> `string`, `int64` or `float32`, with an optional
      shape (`float32[28,28]`): what `tf.io.parse_example` reads.
    features_key: The feature holding the input (an encoded image, or
      numbers); the first string feature of `schema` when None.
    label_key: The feature holding the integer label; the first int64
      feature of `schema` when None.
    label_offset: Added to every label (-1 for files whose labels start at
      1, as the classic ImageNet TFRecords).
    compression_type: None, "GZIP" or "ZLIB".
  """
  train_files: str = gin.REQUIRED
  eval_files: str = gin.REQUIRED
  schema: Mapping[str, str] = dataclasses.field(
      default_factory=lambda: {"image": "string", "label": "int64"})
  features_key: Optional[str] = None
  label_key: Optional[str] = None
  label_offset: int = 0
  compression_type: Optional[str] = None

  def __post_init__(self):
    features = parse_schema(self.schema)
    if self.features_key is None:
      object.__setattr__(self, "features_key", _first(
          features, tf.string, "features_key"))
    if self.label_key is None:
      object.__setattr__(self, "label_key", _first(
          features, tf.int64, "label_key"))
    for name in (self.features_key, self.label_key):
      if name not in features:
        raise errors.ConfigError(
            f"`TFRecordSource`: {name!r} is not in the schema "
            f"({', '.join(features)}).")

  def read(self, training: bool,
           input_context: Optional[tf.distribute.InputContext] = None,
           seed: int = 0) -> tf.data.Dataset:
    """Returns this input pipeline's `(features, label)` examples.

    Args:
      training: Read `train_files` (file order shuffled with `seed`) or
        `eval_files` (in order).
      input_context: Which of how many input pipelines this is.
      seed: Seeds the file order.

    Raises:
      errors.ConfigError: If no file matches the pattern.
    """
    paths = self._paths(training)
    shards = tf.data.Dataset.from_tensor_slices(sorted(paths))
    pipelines = input_context.num_input_pipelines if input_context else 1
    by_file = pipelines > 1 and len(paths) >= pipelines
    if by_file:
      shards = shards.shard(pipelines, input_context.input_pipeline_id)
    if training:
      shards = shards.shuffle(len(paths), seed=seed,
                              reshuffle_each_iteration=True)
    records = shards.interleave(
        lambda path: tf.data.TFRecordDataset(
            path, compression_type=self.compression_type),
        cycle_length=min(len(paths), 16), num_parallel_calls=AUTOTUNE)
    if pipelines > 1 and not by_file:
      records = records.shard(pipelines, input_context.input_pipeline_id)
    return records.map(self._parse, num_parallel_calls=AUTOTUNE)

  def stream(self, training: bool,
             input_context: Optional[tf.distribute.InputContext] = None,
             seed: int = 0, window: int = 1024) -> tf.data.Dataset:
    """Returns this input pipeline's `(features, label)` examples through
    `trainer.data.streaming`: training ones endlessly, each epoch's files in
    a new stateless order and examples shuffled within windows of `window`;
    an iterator over them saves in kilobytes.

    Raises:
      errors.ConfigError: If no file matches the pattern.
    """
    return streaming.stream_files(
        self._paths(training),
        lambda path: tf.data.TFRecordDataset(
            path, compression_type=self.compression_type),
        training=training, seed=seed, window=window,
        input_context=input_context, parse=self._parse)

  def _paths(self, training: bool):
    pattern = self.train_files if training else self.eval_files
    paths = files.glob(pattern)
    if not paths:
      raise errors.ConfigError(
          f"`TFRecordSource.{'train' if training else 'eval'}_files`: no "
          f"file matches {pattern!r}.")
    return paths

  def _parse(self, record):
    example = tf.io.parse_single_example(record, parse_schema(self.schema))
    label = tf.cast(example[self.label_key], tf.int32) + self.label_offset
    return example[self.features_key], label


def _first(features, dtype, name: str) -> str:
  for key, feature in features.items():
    if feature.dtype == dtype and not feature.shape:
      return key
  raise errors.ConfigError(
      f"`TFRecordSource.{name}`: no scalar {dtype.name} feature in the "
      "schema to default to; set it.")
