"""Random tfds datasets on disk, read back by tfds itself."""

import tensorflow_datasets as tfds

from tasks import fake_data


def test_written_splits_load_with_tfds(tmp_path):
  fake_data.write("cifar10", str(tmp_path), {"train": 12, "test": 5})
  train = tfds.load("cifar10", split="train", data_dir=str(tmp_path),
                    as_supervised=True, download=False)
  examples = list(train.as_numpy_iterator())
  assert len(examples) == 12
  assert examples[0][0].shape == (32, 32, 3)
  assert all(0 <= label < 10 for _, label in examples)
  builder = tfds.builder("cifar10", data_dir=str(tmp_path))
  assert builder.info.splits["test"].num_examples == 5


def test_images_of_varying_size(tmp_path):
  fake_data.write("imagenet2012", str(tmp_path),
                  {"train": 6, "validation": 2}, image_sizes=(40, 50))
  train = tfds.load("imagenet2012", split="train", data_dir=str(tmp_path),
                    as_supervised=True, download=False)
  shapes = {image.shape for image, _ in train.as_numpy_iterator()}
  assert all(40 <= h <= 50 and 40 <= w <= 50 and c == 3
             for h, w, c in shapes)
  assert len(shapes) > 1
