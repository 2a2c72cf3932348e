"""The error type for problems a user fixes in their configuration."""


class ConfigError(ValueError):
  """A configuration problem; its message is one line naming the fix."""
