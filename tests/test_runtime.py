"""Runtime settings: validation, strategies, precision."""

import os

import pytest
import tensorflow as tf
import tf_keras

from trainer import errors
from trainer import runtime


@pytest.mark.parametrize("settings,message", [
    (dict(distribution_strategy="mirored"), "`runtime.distribution_strategy`"
     " ('mirored') must be one of"),
    (dict(mixed_precision_dtype="mixed_float16"),
     "`runtime.mixed_precision_dtype` ('mixed_float16') must be one of"),
    (dict(loss_scale=0), "`runtime.loss_scale` (0) must be 'dynamic'"),
    (dict(num_packs=0), "`runtime.num_packs` (0) must be >= 1."),
    (dict(num_gpus=1.5), "`runtime.num_gpus` (1.5) must be an integer."),
    (dict(run_eagerly="yes"), "`runtime.run_eagerly` ('yes') must be True"),
    (dict(seed="1"), "`runtime.seed` ('1') must be an integer or None."),
    (dict(distribution_strategy="mirrored", all_reduce_alg="ring"),
     "`runtime.all_reduce_alg` ('ring') must be one of: nccl, "
     "hierarchical_copy."),
    (dict(distribution_strategy="one_device", all_reduce_alg="nccl"),
     "`runtime.all_reduce_alg` applies to 'mirrored' and "
     "'multi_worker_mirrored', not 'one_device'."),
    (dict(distribution_strategy="multi_worker_mirrored",
          all_reduce_alg="hierarchical_copy"),
     "`runtime.all_reduce_alg` ('hierarchical_copy') must be one of: ring, "
     "nccl."),
    (dict(distribution_strategy="one_device", num_cpu_devices=2),
     "'one_device' runs on one device"),
    (dict(distribution_strategy="mirrored", num_gpus=2, num_cpu_devices=2),
     "cannot both be set"),
    (dict(distribution_strategy="tpu"),
     "`runtime.distribution_strategy='tpu'` needs `runtime.tpu`: a TPU "
     "address, or 'local' for TPUs on this host."),
    (dict(tpu="grpc://1.2.3.4:8470"),
     "`runtime.tpu` needs `runtime.distribution_strategy='tpu'`, not "
     "'default'."),
    (dict(worker_hosts="127.0.0.1:1"),
     "`runtime.worker_hosts` needs `runtime.distribution_strategy="
     "'multi_worker_mirrored'`, not 'default'."),
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
    (dict(task_index=1), "`runtime.task_index` (1) needs "
     "`runtime.worker_hosts`."),
    (dict(distribution_strategy="multi_worker_mirrored", num_cpu_devices=2),
     "`runtime.num_cpu_devices` does not apply to 'multi_worker_mirrored'"),
    (dict(distribution_strategy="parameter_server", enable_xla=True),
     "`runtime.enable_xla` cannot be used with 'parameter_server': XLA "
     "cannot read variables placed on the parameter servers."),
    (dict(distribution_strategy="tpu", tpu="local", enable_xla=True),
     "TPU steps are always compiled with XLA"),
    (dict(cluster_wait_timeout=0),
     "`runtime.cluster_wait_timeout` (0) must be positive."),
    (dict(cluster_wait_timeout=-30.0),
     "`runtime.cluster_wait_timeout` (-30.0) must be positive."),
])
def test_invalid_settings_fail_on_construction(settings, message):
  with pytest.raises(errors.ConfigError) as raised:
    runtime.RuntimeConfig(**settings)
  # Gin appends where the configurable was called; the CLI keeps line one.
  assert message in str(raised.value).splitlines()[0]


@pytest.mark.parametrize("settings,kind,replicas", [
    (dict(), "_DefaultDistributionStrategy", 1),
    (dict(distribution_strategy="one_device"), "OneDeviceStrategy", 1),
    (dict(distribution_strategy="mirrored"), "MirroredStrategy", 1),
    (dict(distribution_strategy="mirrored", num_cpu_devices=2),
     "MirroredStrategy", 2),
])
def test_create_strategy(settings, kind, replicas):
  strategy = runtime.create_strategy(runtime.RuntimeConfig(**settings))
  assert type(strategy).__name__ == kind
  assert strategy.num_replicas_in_sync == replicas


def test_cpu_split_cannot_change_after_devices_exist():
  with pytest.raises(errors.ConfigError,
                     match=r"`runtime.num_cpu_devices` \(3\) cannot be "
                     r"applied: TensorFlow already initialised 2 CPU"):
    runtime.configure_devices(runtime.RuntimeConfig(
        distribution_strategy="mirrored", num_cpu_devices=3))


@pytest.mark.parametrize("dtype,policy,scaled", [
    ("float32", "float32", False),
    ("bfloat16", "mixed_bfloat16", False),
    ("float16", "mixed_float16", True),
])
def test_precision_policy_and_loss_scaling(dtype, policy, scaled):
  config = runtime.RuntimeConfig(mixed_precision_dtype=dtype)
  runtime.set_precision_policy(config)
  assert tf_keras.mixed_precision.global_policy().name == policy
  optimizer = runtime.wrap_optimizer(tf_keras.optimizers.SGD(0.1), config)
  assert isinstance(optimizer,
                    tf_keras.mixed_precision.LossScaleOptimizer) == scaled
  layer = tf_keras.layers.Dense(2)
  layer.build((None, 3))
  assert layer.kernel.dtype == tf.float32  # Variables stay float32.


def test_fixed_loss_scale():
  config = runtime.RuntimeConfig(mixed_precision_dtype="float16",
                                 loss_scale=128)
  optimizer = runtime.wrap_optimizer(tf_keras.optimizers.SGD(0.1), config)
  assert not optimizer.dynamic
  assert float(optimizer.loss_scale) == 128.0


def test_seed_makes_initial_weights_repeatable():
  config = runtime.RuntimeConfig(seed=7)
  weights = []
  for _ in range(2):
    runtime.seed_everything(config)
    layer = tf_keras.layers.Dense(4)
    layer.build((None, 3))
    weights.append(layer.kernel.numpy())
  assert (weights[0] == weights[1]).all()


def test_cpu_mirrored_strategies_can_follow_each_other():
  config = runtime.RuntimeConfig(distribution_strategy="mirrored",
                                 num_cpu_devices=2)
  for size in (5, 3):  # Different shapes in each strategy's all-reduce.
    strategy = runtime.create_strategy(config)
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
    runtime.create_strategy(runtime.RuntimeConfig(
        distribution_strategy="multi_worker_mirrored"))
  assert message in str(raised.value)


def test_tf_config_and_worker_hosts_together_are_refused(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, '
                     '"task": {"type": "worker", "index": 0}}')
  with pytest.raises(errors.ConfigError, match="Both TF_CONFIG and"):
    runtime.create_strategy(runtime.RuntimeConfig(
        distribution_strategy="multi_worker_mirrored",
        worker_hosts="127.0.0.1:1"))


def test_tpu_without_a_tpu_is_one_clear_error():
  with pytest.raises(errors.ConfigError,
                     match=r"^no TPU reachable at `runtime.tpu` \('local'\)"):
    runtime.create_strategy(runtime.RuntimeConfig(
        distribution_strategy="tpu", tpu="local"))


def test_central_storage_strategy():
  strategy = runtime.create_strategy(
      runtime.RuntimeConfig(distribution_strategy="central_storage"))
  assert type(strategy).__name__ == "CentralStorageStrategy"


@pytest.mark.parametrize("settings,message", [
    (dict(gpu_thread_mode="gpu_private"),
     "`runtime.gpu_thread_mode` needs `runtime.num_gpus` > 0."),
    (dict(gpu_thread_mode="private", num_gpus=1),
     "`runtime.gpu_thread_mode` ('private') must be one of: gpu_private, "
     "gpu_shared, global."),
    (dict(per_gpu_thread_count=2),
     "`runtime.per_gpu_thread_count` needs `runtime.gpu_thread_mode`."),
    (dict(dataset_num_private_threads=-1), "must not be negative"),
    (dict(dataset_batch_parallel_calls=-2),
     "`runtime.dataset_batch_parallel_calls` (-2) must be -1 (AUTOTUNE), 0 "
     "(in the prefetch thread) or a positive number."),
    (dict(dataset_batch_parallel_calls=1.5),
     "`runtime.dataset_batch_parallel_calls` (1.5) must be an integer."),
])
def test_invalid_thread_settings(settings, message):
  with pytest.raises(errors.ConfigError) as raised:
    runtime.RuntimeConfig(**settings)
  assert message in str(raised.value).splitlines()[0]


def test_gpu_thread_settings_reach_the_environment(monkeypatch):
  monkeypatch.delenv("TF_GPU_THREAD_MODE", raising=False)
  monkeypatch.delenv("TF_GPU_THREAD_COUNT", raising=False)
  runtime.configure_threads(runtime.RuntimeConfig(
      distribution_strategy="mirrored", num_gpus=2,
      gpu_thread_mode="gpu_private", per_gpu_thread_count=3))
  assert os.environ["TF_GPU_THREAD_MODE"] == "gpu_private"
  assert os.environ["TF_GPU_THREAD_COUNT"] == "3"


def test_parameter_server_needs_tf_config(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(errors.ConfigError,
                     match="'parameter_server' needs TF_CONFIG with chief, "
                     "worker and ps tasks."):
    runtime.create_strategy(runtime.RuntimeConfig(
        distribution_strategy="parameter_server"))
