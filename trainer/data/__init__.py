"""Input: building a Task's datasets, telling damaged input apart, and the
tf.data service."""
