"""The host CPU split into logical devices (conftest.py split it in 2)."""

import pytest
import tensorflow as tf

from trainer import errors
from trainer import runtime as runtime_lib
from trainer.distribute import devices
from trainer.distribute import placement
from trainer.distribute import strategy as strategy_lib


def test_the_split_tensorflow_already_has_is_accepted():
  devices.split_cpu(2, "runtime.num_cpu_devices")
  assert len(tf.config.list_logical_devices("CPU")) == 2


@pytest.mark.parametrize("call, message", [
    (lambda: devices.split_cpu(3, "x.count", effect="split the CPU"),
     "`x.count` (3) cannot split the CPU: TensorFlow already initialised 2 "
     "CPU device(s). Set it before any TensorFlow op runs."),
    (lambda: strategy_lib.configure_devices(
        runtime_lib.RuntimeConfig(distribution_strategy="mirrored",
                                  num_cpu_devices=4)),
     "`runtime.num_cpu_devices` (4) cannot be applied: TensorFlow already "
     "initialised 2 CPU device(s). Set it before any TensorFlow op runs."),
    (lambda: placement.configure(3),
     "`runtime.model_parallel_devices` (3) cannot split the CPU: TensorFlow "
     "already initialised 2 CPU device(s). Set it before any TensorFlow op "
     "runs."),
])
def test_another_split_after_tensorflow_started_is_one_line(call, message):
  # Started here if no earlier test of this process started it: before,
  # the split would succeed and change the devices every later test gets.
  assert len(tf.config.list_logical_devices("CPU")) == 2
  with pytest.raises(errors.ConfigError) as raised:
    call()
  assert str(raised.value) == message


def test_model_parts_and_pipeline_stages_take_the_split_cpus():
  assert placement.configure(2) == ["/device:CPU:0", "/device:CPU:1"]
  assert devices.first_devices(2, "x", needs="x's 2 parts") == [
      "/device:CPU:0", "/device:CPU:1"]


@pytest.mark.parametrize("count, found", [
    (2, ["/device:GPU:0", "/device:GPU:1"]),
    (4, "the pipeline's 4 stages need 4 GPUs; this host has 3."),
])
def test_gpus_come_first_and_too_few_is_one_line(monkeypatch, count, found):
  # Stands in for a host with three GPUs: the choice reads only their list.
  monkeypatch.setattr(
      tf.config, "list_physical_devices",
      lambda kind=None: ["gpu"] * 3 if kind == "GPU" else ["cpu"])
  try:
    result = devices.first_devices(count, "pipeline",
                                   needs=f"the pipeline's {count} stages")
  except errors.ConfigError as e:
    result = str(e)
  assert result == found
