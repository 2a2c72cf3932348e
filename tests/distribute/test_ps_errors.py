"""trainer.distribute.ps_errors: a lost parameter server named in one line."""

import json

import pytest
import tensorflow as tf

from trainer import errors
from trainer.distribute import ps_errors


def _tf_config(monkeypatch, task_type):
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                  "ps": ["127.0.0.1:3"]},
      "task": {"type": task_type, "index": 0}}))


def test_a_lost_ps_is_one_line_wherever_the_chief_meets_it(monkeypatch):
  _tf_config(monkeypatch, "chief")
  reset = ("recvmsg:Connection reset by peer\nAdditional GRPC error "
           "information from remote target /job:ps/replica:0/task:0/device:"
           "CPU:0 while calling /tensorflow.eager.EagerService/Enqueue")
  refused = ("failed to connect to all addresses; last error: UNKNOWN: "
             "ipv4:127.0.0.1:3: Failed to connect to remote host: Connection "
             "refused\nAdditional GRPC error information from remote target "
             "/job:ps/replica:0/task:0 while calling /tensorflow.eager."
             "EagerService/Enqueue")
  tail = (": the variables it held are lost; the checkpoints saved before "
          "stay: restart it, then run the chief's command again to resume "
          "from the newest")
  for error, line in [
      (tf.errors.UnavailableError(None, None, reset),
       "ps 0 at 127.0.0.1:3 is unreachable" + tail),
      (tf.errors.UnavailableError(None, None, refused),
       "ps 0 at 127.0.0.1:3 is unreachable (Connection refused)" + tail),
      (tf.errors.InternalError(None, None, "Failed copying input tensor: "
                               + reset),
       "ps 0 at 127.0.0.1:3 is unreachable" + tail)]:
    with pytest.raises(errors.RunError) as raised:
      with ps_errors.naming_lost_ps():
        raise error
    assert str(raised.value) == line
    assert raised.value.__cause__ is error
  # A ps op's own failure, and a worker's loss, stay what they are.
  for error in [
      tf.errors.InvalidArgumentError(
          None, None, "Shapes [3] and [4] are incompatible; on "
          "/job:ps/replica:0/task:0/device:CPU:0"),
      tf.errors.UnavailableError(None, None, reset.replace("ps", "worker"))]:
    with pytest.raises(type(error)):
      with ps_errors.naming_lost_ps():
        raise error
