"""Loading a worker's shard of a tensorflow-datasets split.

tfds shards by files (`ReadConfig(input_context=...)`), which is the cheap
way, but refuses when a split has fewer files than input pipelines (MNIST's
train split is a single file). Those splits are divided by examples with the
subsplit API instead (`tfds.even_splits`), so every worker still reads a
disjoint part.

`stream_shard` reads a split's record files through
`trainer.data.streaming` instead of `tfds.load`: each epoch's files in a
stateless order, examples shuffled within windows, an iterator state of
kilobytes. (`tfds.load(shuffle_files=True)` shuffles its file instructions
in a buffer that the iterator's checkpoint holds.)
"""

from typing import Optional

import tensorflow as tf

from trainer import errors
from trainer.data import streaming


def _builder(name: str, data_dir: Optional[str]):
  # Imported here: tensorflow-datasets takes ~0.7 s to import (pandas,
  # scipy), which the tasks that share this module's users but read no
  # tfds dataset (digits) would otherwise pay at every start.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise errors.ConfigError(f"no tfds dataset named '{name}'.") from e


def _not_prepared(name: str, data_dir: Optional[str]) -> errors.ConfigError:
  return errors.ConfigError(
      f"tfds dataset '{name}' is not prepared in data_dir "
      f"({data_dir or 'the tfds default'}): nothing is downloaded at "
      f"training time; run `tfds build {name}` (with --data_dir) first.")


def stream_shard(name: str, split: str, *, data_dir: Optional[str],
                 input_context: Optional[tf.distribute.InputContext],
                 training: bool, seed: int, window: int,
                 decode_images: bool = True) -> tf.data.Dataset:
  """Returns this input pipeline's `(image, label)` pairs of `split`, read
  from tfds's record files with `trainer.data.streaming.stream_files`:
  training ones endlessly, shuffled within windows of `window` examples;
  evaluation ones once, in order.

  A dataset stored in another file format than TFRecord (array_record) is
  read by `load_shard`, shuffled in a buffer of `window` examples.

  Args:
    name: The tfds dataset, prepared beforehand (nothing is downloaded).
    split: The split to read.
    data_dir: Where tfds keeps the dataset; None for tfds's default.
    input_context: Which of how many input pipelines this is; None for all.
    training: Shuffle and repeat, or one pass in order.
    seed: Seeds the file orders and the windows.
    window: Examples per shuffle window.
    decode_images: False leaves images as their encoded bytes.

  Raises:
    errors.ConfigError: If the dataset is not prepared in `data_dir`.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = _builder(name, data_dir)
  if not builder.is_prepared():
    raise _not_prepared(name, data_dir)
  if builder.info.file_format != tfds.core.FileFormat.TFRECORD:
    dataset = load_shard(name, split, data_dir=data_dir,
                         input_context=input_context, shuffle_files=training,
                         shuffle_seed=seed, decode_images=decode_images)
    return dataset.shuffle(window, seed=seed).repeat() if training else (
        dataset)
  features = builder.info.features
  image_key, label_key = builder.info.supervised_keys
  decoders = None if decode_images else {
      image_key: tfds.decode.SkipDecoding()}

  def parse(record):
    example = features.deserialize_example(record, decoders=decoders)
    return example[image_key], tf.cast(example[label_key], tf.int32)

  return streaming.stream_files(
      [str(path) for path in builder.info.splits[split].filepaths],
      tf.data.TFRecordDataset, training=training, seed=seed, window=window,
      input_context=input_context, parse=parse)


def load_shard(name: str, split: str, *, data_dir: Optional[str],
               input_context: Optional[tf.distribute.InputContext],
               shuffle_files: bool, shuffle_seed: int,
               decode_images: bool = True) -> tf.data.Dataset:
  """Returns this input pipeline's part of `split`, as (image, label) pairs.

  The record files are read with a parallel interleave (16 files at a time,
  `AUTOTUNE` parallel reads).

  Args:
    name: The tfds dataset, prepared beforehand (nothing is downloaded).
    split: The split to read.
    data_dir: Where tfds keeps the dataset; None for tfds's default.
    input_context: Which of how many input pipelines this is; None for all.
    shuffle_files: Read the files in a seeded random order.
    shuffle_seed: Seeds the file order.
    decode_images: False leaves images as their encoded bytes (to decode
      only a crop of them).

  Raises:
    errors.ConfigError: If the dataset is not prepared in `data_dir`.
  """
  # Imported here: tensorflow-datasets takes ~0.7 s to import (pandas,
  # scipy), which the tasks that share this module's users but read no
  # tfds dataset (digits) would otherwise pay at every start.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  read_config = tfds.ReadConfig(
      shuffle_seed=shuffle_seed, interleave_cycle_length=16,
      num_parallel_calls_for_interleave_files=tf.data.AUTOTUNE)
  pipelines = input_context.num_input_pipelines if input_context else 1
  builder = _builder(name, data_dir)
  if pipelines > 1:
    if builder.info.splits[split].num_shards >= pipelines:
      read_config.input_context = input_context
    else:
      split = tfds.even_splits(split, n=pipelines)[
          input_context.input_pipeline_id]
  try:
    return tfds.load(name, split=split, data_dir=data_dir,
                     as_supervised=True, shuffle_files=shuffle_files,
                     download=False, read_config=read_config,
                     decoders=None if decode_images else {
                         "image": tfds.decode.SkipDecoding()})
  except AssertionError as e:  # tfds's way of saying the data is not there.
    if "could not find data" not in str(e):
      raise
    raise _not_prepared(name, data_dir) from e
