"""`HashedRecommendation`: click prediction from hashed user and item ids.

The shape of a recommender whose embedding table outgrows one machine, on
embedded synthetic data (no download). Users and items are arbitrary 63-bit
ids, as production ids are, hashed into one shared embedding table
(`tf_keras.layers.Hashing`, with a different salt for users and items).
Each user and item has a hidden taste vector (seeded); a user clicks an
item when their tastes agree, up to label noise. The model embeds both ids,
and a small MLP over the two embeddings and their product gives the click
logit.

The table, `table_size` rows of `embedding_dim` floats (4 MiB by default),
is nearly all of the model's weights: under `parameter_server` with
`runtime.variable_partitioner` it is split over the ps tasks
(gin/runtime/parameter_server_sharded.gin).
"""

from typing import Tuple

import gin
import numpy as np
import tensorflow as tf
import tf_keras

import trainer
from trainer.data import inputs

_TASTE_DIM = 4
_LABEL_NOISE = 0.3  # Standard deviation added to the taste agreement.


@gin.configurable
class HashedRecommendation(trainer.Task):
  """Predicts clicks of synthetic users on synthetic items."""

  def __init__(self, num_users: int = 1000, num_items: int = 200,
               num_train: int = 40000, num_eval: int = 8000,
               table_size: int = 65536, embedding_dim: int = 16,
               hidden_units: int = 32, seed: int = 0):
    """Configures the task.

    Args:
      num_users: Distinct users.
      num_items: Distinct items.
      num_train: Training interactions (user, item, clicked).
      num_eval: Evaluation interactions, drawn apart from the training ones.
      table_size: Rows of the shared embedding table ids are hashed into.
      embedding_dim: Width of each embedding.
      hidden_units: Width of the MLP over the embeddings.
      seed: Seeds the ids, tastes, interactions and training order.
    """
    self.num_users = num_users
    self.num_items = num_items
    self.num_train = num_train
    self.num_eval = num_eval
    self.table_size = table_size
    self.embedding_dim = embedding_dim
    self.hidden_units = hidden_units
    self.seed = seed

  def interactions(self, training: bool) -> Tuple[np.ndarray, np.ndarray]:
    """Returns `(ids [n, 2] int64: user id, item id; clicked [n] float32)`."""
    rng = np.random.RandomState(self.seed)
    user_ids = rng.randint(1, 2**62, size=self.num_users, dtype=np.int64)
    item_ids = rng.randint(1, 2**62, size=self.num_items, dtype=np.int64)
    user_tastes = rng.normal(size=(self.num_users, _TASTE_DIM))
    item_tastes = rng.normal(size=(self.num_items, _TASTE_DIM))
    total = self.num_train + self.num_eval
    users = rng.randint(self.num_users, size=total)
    items = rng.randint(self.num_items, size=total)
    agreement = np.sum(user_tastes[users] * item_tastes[items], axis=1)
    clicked = agreement + _LABEL_NOISE * rng.normal(size=total) > 0
    chosen = slice(0, self.num_train) if training else slice(self.num_train,
                                                             total)
    ids = np.stack([user_ids[users], item_ids[items]], axis=1)
    return ids[chosen], clicked[chosen].astype(np.float32)

  def build_inputs(self, training, input_context=None) -> tf.data.Dataset:
    return inputs.examples_from_arrays(self.interactions(training), training,
                                       input_context, seed=self.seed)

  def build_model(self) -> tf_keras.Model:
    ids = tf_keras.Input((2,), dtype=tf.int64, name="ids")
    # Salted apart: a user and an item with equal ids get other rows.
    users = tf_keras.layers.Hashing(self.table_size, salt=[1, 2],
                                    name="hash_users")(ids[:, 0])
    items = tf_keras.layers.Hashing(self.table_size, salt=[3, 4],
                                    name="hash_items")(ids[:, 1])
    table = tf_keras.layers.Embedding(self.table_size, self.embedding_dim,
                                      name="embedding")
    user, item = table(users), table(items)
    features = tf_keras.layers.Concatenate(name="concat")(
        [user, item, user * item])
    hidden = tf_keras.layers.Dense(self.hidden_units, activation="relu",
                                   name="hidden")(features)
    logits = tf_keras.layers.Dense(1, name="logit")(hidden)
    return tf_keras.Model(ids, logits, name="hashed_recommendation")

  def build_losses(self, labels, model_outputs, aux_losses=None):
    del aux_losses
    return tf_keras.losses.binary_crossentropy(
        labels[:, None], model_outputs, from_logits=True)

  def build_metrics(self, training=True):
    del training
    return [tf_keras.metrics.BinaryAccuracy("accuracy", threshold=0.0),
            tf_keras.metrics.AUC(name="auc", from_logits=True)]

  def process_metrics(self, metrics, labels, model_outputs) -> None:
    for metric in metrics:
      metric.update_state(labels[:, None], model_outputs)
