"""trainer.distribute.strategy: the process set up for a `RuntimeConfig`
(the settings that need this package checked, the cluster joined) and the
strategy it names."""

import os

import pytest
import tensorflow as tf

from trainer import errors
from trainer import runtime as runtime_lib
from trainer.distribute import strategy as strategy_lib


@pytest.mark.parametrize("settings,message", [
    (dict(distribution_strategy="multi_worker_mirrored",
          worker_hosts="127.0.0.1:1,127.0.0.1", task_index=0),
     "`runtime.worker_hosts` entry '127.0.0.1' is not `host:port`."),
    (dict(distribution_strategy="multi_worker_mirrored",
          worker_hosts="127.0.0.1:1,127.0.0.1:2", task_index=2),
     "`runtime.task_index` (2) must be in [0, 2) for 2 "
     "`runtime.worker_hosts`."),
    (dict(distribution_strategy="multi_worker_mirrored",
          worker_hosts="127.0.0.1:1,127.0.0.1:2"),
     "`runtime.task_index` (-1) must be in [0, 2)"),
    (dict(distribution_strategy="multi_worker_mirrored",
          worker_hosts="127.0.0.1:1", task_index=5),
     "`runtime.task_index` (5) must be in [0, 1) for 1 "
     "`runtime.worker_hosts`."),
    (dict(port_base=65500),
     "`runtime.port_base` (65500) leaves no room for a node's tasks below "
     "port 65535."),
])
def test_invalid_cluster_settings_fail_when_the_process_is_set_up(
    settings, message):
  # Accepted on construction: the check needs this package.
  config = runtime_lib.RuntimeConfig(**settings)
  with pytest.raises(errors.ConfigError) as raised:
    strategy_lib.set_up(config)
  assert message in str(raised.value).splitlines()[0]


@pytest.mark.parametrize("settings,kind,replicas", [
    (dict(), "_DefaultDistributionStrategy", 1),
    (dict(distribution_strategy="one_device"), "OneDeviceStrategy", 1),
    (dict(distribution_strategy="mirrored"), "MirroredStrategy", 1),
    (dict(distribution_strategy="mirrored", num_cpu_devices=2),
     "MirroredStrategy", 2),
])
def test_create_strategy(settings, kind, replicas):
  strategy = strategy_lib.create_strategy(
      runtime_lib.RuntimeConfig(**settings))
  assert type(strategy).__name__ == kind
  assert strategy.num_replicas_in_sync == replicas


def test_cpu_split_cannot_change_after_devices_exist():
  with pytest.raises(errors.ConfigError,
                     match=r"`runtime.num_cpu_devices` \(3\) cannot be "
                     r"applied: TensorFlow already initialised 2 CPU"):
    strategy_lib.configure_devices(runtime_lib.RuntimeConfig(
        distribution_strategy="mirrored", num_cpu_devices=3))


def test_cpu_mirrored_strategies_can_follow_each_other():
  config = runtime_lib.RuntimeConfig(distribution_strategy="mirrored",
                                 num_cpu_devices=2)
  for size in (5, 3):  # Different shapes in each strategy's all-reduce.
    strategy = strategy_lib.create_strategy(config)
    with strategy.scope():
      variable = tf.Variable(tf.zeros([size]))

    @tf.function
    def step(variable=variable, strategy=strategy):
      def replica_fn():
        context = tf.distribute.get_replica_context()
        return context.all_reduce("sum", tf.ones_like(variable))
      return strategy.run(replica_fn)

    results = strategy.experimental_local_results(step())
    assert [r.numpy().tolist() for r in results] == [[2.0] * size] * 2


@pytest.mark.parametrize("tf_config,message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ('{"task": {"type": "worker", "index": 0}}',
     "TF_CONFIG needs a `cluster` object"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", '
     '"index": 3}}', "TF_CONFIG task {'type': 'worker', 'index': 3} does not "
     "name a member of its cluster (worker)."),
])
def test_malformed_tf_config_is_a_config_error(monkeypatch, tf_config,
                                               message):
  monkeypatch.setenv("TF_CONFIG", tf_config)
  with pytest.raises(errors.ConfigError) as raised:
    strategy_lib.create_strategy(runtime_lib.RuntimeConfig(
        distribution_strategy="multi_worker_mirrored"))
  assert message in str(raised.value)


def test_tf_config_and_worker_hosts_together_are_refused(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, '
                     '"task": {"type": "worker", "index": 0}}')
  with pytest.raises(errors.ConfigError, match="Both TF_CONFIG and"):
    strategy_lib.create_strategy(runtime_lib.RuntimeConfig(
        distribution_strategy="multi_worker_mirrored",
        worker_hosts="127.0.0.1:1"))


def test_tpu_without_a_tpu_is_one_clear_error():
  with pytest.raises(errors.ConfigError,
                     match=r"^no TPU reachable at `runtime.tpu` \('local'\)"):
    strategy_lib.create_strategy(runtime_lib.RuntimeConfig(
        distribution_strategy="tpu", tpu="local"))


def test_central_storage_strategy():
  strategy = strategy_lib.create_strategy(
      runtime_lib.RuntimeConfig(distribution_strategy="central_storage"))
  assert type(strategy).__name__ == "CentralStorageStrategy"


def test_gpu_thread_settings_reach_the_environment(monkeypatch):
  monkeypatch.delenv("TF_GPU_THREAD_MODE", raising=False)
  monkeypatch.delenv("TF_GPU_THREAD_COUNT", raising=False)
  strategy_lib.configure_threads(runtime_lib.RuntimeConfig(
      distribution_strategy="mirrored", num_gpus=2,
      gpu_thread_mode="gpu_private", per_gpu_thread_count=3))
  assert os.environ["TF_GPU_THREAD_MODE"] == "gpu_private"
  assert os.environ["TF_GPU_THREAD_COUNT"] == "3"


def test_parameter_server_needs_tf_config(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(errors.ConfigError,
                     match="'parameter_server' needs TF_CONFIG with chief, "
                     "worker and ps tasks."):
    strategy_lib.create_strategy(runtime_lib.RuntimeConfig(
        distribution_strategy="parameter_server"))
