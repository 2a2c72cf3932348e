"""`ImdbSentiment`: IMDB review sentiment with a small Transformer encoder.

Text becomes token ids without a vocabulary file: each review is lower-cased
and split by tensorflow-text (`case_fold_utf8`, `WhitespaceTokenizer`), and
each token is hashed into `vocab_size - 1` buckets (id 0 pads), a whole batch
at a time. The encoder is built from Model Garden's NLP layers
(`official.nlp.modeling.layers`: `OnDeviceEmbedding`, `PositionEmbedding`,
`TransformerEncoderBlock`), followed by a mean over the real tokens and a
dense head. Exports serve raw review text.
"""

import gin
import tensorflow as tf
import tensorflow_text as tf_text
import tf_keras
from official.nlp.modeling import layers as nlp_layers

from tasks import classification

# Punctuation is split off words before tokenizing.
_PUNCTUATION = r"([!-/:-@\[-`{-~])"


@gin.configurable
class ImdbSentiment(classification.DatasetClassificationTask):
  """Positive or negative reviews of tfds `imdb_reviews` (or TFRecords with
  a text feature).

  The 25,000 training reviews (33 MB of text) are held in memory once read;
  tokenizing happens per batch in the input pipeline.
  """

  tfds_name = "imdb_reviews"

  def __init__(self, vocab_size: int = 32768, max_length: int = 256,
               hidden_size: int = 64, num_layers: int = 2,
               num_heads: int = 2, inner_size: int = 128,
               dropout_rate: float = 0.0, **kwargs):
    """Configures the task.

    Args:
      vocab_size: Hash buckets of token ids, padding included.
      max_length: Tokens per review kept (the first ones).
      hidden_size: Width of the embeddings and encoder.
      num_layers: Transformer encoder blocks.
      num_heads: Attention heads per block.
      inner_size: Width of each block's feed-forward layer.
      dropout_rate: Dropout in the encoder. Keras dropout draws from a random
        state no checkpoint holds: above 0, a resumed run is not exact.
      **kwargs: `data_dir`, `tfrecords`, `shuffle_seed` (see
        `DatasetClassificationTask`).
    """
    super().__init__(**kwargs)
    self.vocab_size = vocab_size
    self.max_length = max_length
    self.hidden_size = hidden_size
    self.num_layers = num_layers
    self.num_heads = num_heads
    self.inner_size = inner_size
    self.dropout_rate = dropout_rate

  def tokenize(self, texts: tf.Tensor) -> tf.Tensor:
    """Returns `[batch, max_length]` int32 token ids of a batch of texts."""
    texts = tf_text.case_fold_utf8(texts)
    texts = tf.strings.regex_replace(texts, _PUNCTUATION, r" \1 ")
    tokens = tf_text.WhitespaceTokenizer().tokenize(texts)
    ids = tf.strings.to_hash_bucket_fast(tokens, self.vocab_size - 1) + 1
    ids = ids[:, :self.max_length].to_tensor(
        default_value=0, shape=[None, self.max_length])
    return tf.cast(ids, tf.int32)

  def build_model(self) -> tf_keras.Model:
    ids = tf_keras.Input((self.max_length,), dtype=tf.int32, name="ids")
    embeddings = nlp_layers.OnDeviceEmbedding(
        self.vocab_size, self.hidden_size, name="token_embedding")(ids)
    embeddings += nlp_layers.PositionEmbedding(
        self.max_length, name="position_embedding")(embeddings)
    real = tf.cast(tf.not_equal(ids, 0), embeddings.dtype)  # [b, l]
    # Attention only to real tokens: [b, l, l].
    mask = nlp_layers.SelfAttentionMask()(embeddings, real)
    hidden = embeddings
    for index in range(self.num_layers):
      hidden = nlp_layers.TransformerEncoderBlock(
          num_attention_heads=self.num_heads, inner_dim=self.inner_size,
          inner_activation="relu", output_dropout=self.dropout_rate,
          attention_dropout=self.dropout_rate, name=f"encoder_{index}")(
              [hidden, mask])
    pooled = tf.reduce_sum(hidden * real[..., None], axis=1) / tf.maximum(
        tf.reduce_sum(real, axis=1, keepdims=True), 1.0)
    logits = tf_keras.layers.Dense(2, name="logits")(pooled)
    return tf_keras.Model(ids, logits, name="imdb_transformer")

  def preprocess_batch(self, batch, training, seed):
    del seed
    texts, labels = self.gather(batch, training)
    return self.tokenize(texts), labels

  def export_signatures(self, model, features_spec):
    """Serves raw reviews: `serving_default(text)` -> `{"outputs": logits}`."""
    del features_spec

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string,
                                                name="text")])
    def serve(text):
      logits = model(self.tokenize(text), training=False)
      return {"outputs": tf.cast(logits, tf.float32)}

    return {"serving_default": serve}
