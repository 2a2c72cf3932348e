"""trainer.model.seeds: seeds and op determinism."""

import tf_keras

from trainer import runtime as runtime_lib
from trainer.model import seeds


def test_seed_makes_initial_weights_repeatable():
  config = runtime_lib.RuntimeConfig(seed=7)
  weights = []
  for _ in range(2):
    seeds.seed_everything(config)
    layer = tf_keras.layers.Dense(4)
    layer.build((None, 3))
    weights.append(layer.kernel.numpy())
  assert (weights[0] == weights[1]).all()
