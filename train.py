"""Trains and evaluates a gin-configured Task; see `trainer.cli`.

Example:
  python train.py --gin_file=gin/digits.gin --model_dir=runs/digits
"""

import trainer  # noqa: F401  Selects Keras 2 before TensorFlow loads.
from trainer import cli

if __name__ == "__main__":
  cli.run()
