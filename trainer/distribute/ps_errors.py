"""A lost parameter server, named: TensorFlow's gRPC error turned into one
line that says which ps is gone and what to do."""

import contextlib
import re
from typing import Optional

import tensorflow as tf

from trainer import errors

_PS_TASK = re.compile(r"/job:ps/(?:replica:\d+/)?task:(\d+)")
# gRPC's reason: "last error: UNKNOWN: ipv4:127.0.0.1:46041: Failed to
# connect to remote host: Connection refused" (or another socket error).
_LAST_ERROR = re.compile(r"last error: (?:[A-Z_]+: )?(?:ipv[46]:\S+: )?"
                         r"(?:Failed to connect to remote host: )?"
                         r"([^\n\"{}]+)")
# gRPC's words for a peer gone, in an error of another type than
# `UnavailableError` (its status 14).
_CONNECTION_LOST = re.compile(r"failed to connect to all addresses|"
                              r"Connection reset by peer|Socket closed")


def lost_ps(error: tf.errors.OpError) -> Optional[errors.RunError]:
  """Says which parameter server `error` lost, and what to do; None if it
  names none, or no lost connection (a worker's loss the coordinator
  recovers from; a ps op's own failure).

  TensorFlow's message is gRPC's, several hundred characters: `failed to
  connect to all addresses; ... remote target /job:ps/replica:0/task:0/...`
  or `recvmsg:Connection reset by peer ... /job:ps/replica:0/task:0/device:
  CPU:0 while calling /tensorflow.eager.EagerService/Enqueue` (measured, the
  ps killed in a loop or between loops: an `UnavailableError` each time).
  """
  found = _PS_TASK.search(error.message)
  if found is None or not (
      isinstance(error, tf.errors.UnavailableError) or
      _CONNECTION_LOST.search(error.message)):
    return None
  index = int(found.group(1))
  spec = tf.distribute.cluster_resolver.TFConfigClusterResolver(
  ).cluster_spec()
  address = spec.task_address("ps", index)
  reason = _LAST_ERROR.search(error.message)
  return errors.RunError(
      f"ps {index} at {address} is unreachable"
      f"{f' ({reason.group(1).strip()})' if reason else ''}: the variables "
      "it held are lost; the checkpoints saved before stay: restart it, "
      "then run the chief's command again to resume from the newest")


@contextlib.contextmanager
def naming_lost_ps():
  """Turns the error of a parameter server gone into `lost_ps`'s line,
  wherever the chief meets it: creating or restoring the variables, in a
  loop, reading its metrics, saving, evaluating.

  Raises:
    errors.RunError: For a lost parameter server, naming it.
  """
  try:
    yield
  except tf.errors.OpError as e:
    lost = lost_ps(e)
    if lost is None:
      raise
    raise lost from e
