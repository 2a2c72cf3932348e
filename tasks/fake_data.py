"""Random stand-ins for tensorflow-datasets datasets, written to disk.

The examples are random, but they are written in tfds's own on-disk format
(TFRecord files and `dataset_info.json`) under the dataset's real name and
version, with the real builder's features. So `tfds.load(name,
data_dir=...)`, and the shipped tasks' whole pipelines (file reading,
decoding, sharding), run on them as on the real data: in tests, benchmarks
and smoke runs, without a download. (`tfds.testing.mock_data` instead makes
examples up in memory, bypassing the file readers.)
"""

from typing import Dict, Tuple

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

# Splits written by default, with their example counts.
DEFAULT_SPLITS: Dict[str, Dict[str, int]] = {
    "mnist": {"train": 256, "test": 64},
    "cifar10": {"train": 256, "test": 64},
    "imagenet2012": {"train": 32, "validation": 16},
}


def _example_arrays(features: tfds.features.FeaturesDict, count: int,
                    rng: np.random.RandomState,
                    image_sizes: Tuple[int, int]) -> Dict[str, list]:
  """Random values for each feature of `features`, `count` of each."""
  arrays = {}
  for name, feature in features.items():
    if isinstance(feature, tfds.features.Image):
      shape = list(feature.shape)
      images = []
      for _ in range(count):
        sized = [rng.randint(image_sizes[0], image_sizes[1] + 1)
                 if dim is None else dim for dim in shape]
        images.append(rng.randint(0, 256, sized).astype(np.uint8))
      arrays[name] = images
    elif isinstance(feature, tfds.features.ClassLabel):
      arrays[name] = list(rng.randint(0, feature.num_classes, count))
    elif isinstance(feature, tfds.features.Text):
      arrays[name] = [f"{name}_{i}" for i in range(count)]
    else:
      raise ValueError(f"no fake values for feature {name!r} ({feature}).")
  return arrays


def write(name: str, data_dir: str, counts: Dict[str, int] = None,
          seed: int = 0, image_sizes: Tuple[int, int] = (64, 96)) -> None:
  """Writes random examples as tfds dataset `name` under `data_dir`.

  Args:
    name: A registered tfds dataset (`mnist`, `cifar10`, `imagenet2012`...).
    data_dir: The tfds data directory to write to.
    counts: Split name -> example count; `DEFAULT_SPLITS[name]` if None.
    seed: Seeds the values.
    image_sizes: `(smallest, largest)` side of images whose size varies.
  """
  counts = counts or DEFAULT_SPLITS[name]
  builder = tfds.builder(name, data_dir=data_dir)
  features = builder.info.features
  rng = np.random.RandomState(seed)

  def split(count):
    arrays = _example_arrays(features, count, rng, image_sizes)
    return tf.data.Dataset.from_generator(
        lambda: ({key: values[i] for key, values in arrays.items()}
                 for i in range(count)),
        output_signature=features.get_tensor_spec())

  tfds.dataset_builders.TfDataBuilder(
      name=name, version=str(builder.version), data_dir=data_dir,
      split_datasets={key: split(count) for key, count in counts.items()},
      features=features,
  ).download_and_prepare()


def write_for_task(task, data_dir: str, train_examples: int,
                   seed: int = 0) -> str:
  """Writes fake data for a shipped image task's tfds dataset; points the
  task at it.

  Args:
    task: A `DatasetClassificationTask` reading tfds (its `data_dir` is set).
    data_dir: Where to write.
    train_examples: Examples in the training split; the evaluation split
      gets a fifth as many.
    seed: Seeds the values.

  Returns:
    The gin binding that points another process's task at the data.

  Raises:
    ValueError: If `task` reads no tfds dataset.
  """
  name = getattr(task, "tfds_name", "")
  if not name or getattr(task, "tfrecords", None) is not None:
    raise ValueError(f"{type(task).__name__} reads no tfds dataset to fake.")
  write(name, data_dir, {task.train_split: train_examples,
                         task.eval_split: max(train_examples // 5, 1)},
        seed=seed)
  task.data_dir = data_dir
  return f"{type(task).__name__}.data_dir = '{data_dir}'"
