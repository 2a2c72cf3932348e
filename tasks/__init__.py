"""Shipped Tasks, one module each; gin files import the module they use."""

import trainer  # noqa: F401  Selects Keras 2 before TensorFlow loads.
