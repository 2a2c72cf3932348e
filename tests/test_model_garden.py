"""Model Garden experiments run unchanged (`trainer.model_garden`).

The peer checks: on the same experiment config, strategy and data, with
deterministic ops, Model Garden's own `train_lib.run_experiment` (run here,
in this process, from Model Garden's own parser) and `train.py` end with the
same weights and give the same evaluation results: on the `mock`
experiment (one device) and on official.vision's `image_classification`
(a ResNet-10 at a quarter width on 32x32 synthetic TFRecords written with
`tfexample_utils`, on 2 replicas; slow: 45 s). Measured on CPU:
bit-identical weights (max abs difference 0.0) and the same evaluation
results, to the last bit; the tests allow `TOLERANCE`. official.nlp's
`bert/sentence_prediction` (2 layers, hidden size 32, 10 steps; slow) is
not bit-identical: Grappler rewrites the two loops' step differently
(`BERT_TOLERANCE`).
"""

import os
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from trainer import errors
from trainer import gin_config
from trainer import model_garden
from trainer.storage import files

import helpers

MOCK_GIN = "gin/model_garden_mock.gin"
# The largest weight or result difference allowed between Model Garden's
# run and ours, relative to the largest magnitude (at least 1). Measured:
# 0.0 (bit-identical) for both experiments, 1 and 2 replicas.
TOLERANCE = 1e-6


def _relative(a: float, b: float) -> float:
  return abs(a - b) / max(1.0, abs(a))


def model_garden_run(experiment: str, config_files, params_override,
                     model_dir: str, replicas: int = 1):
  """Model Garden's own run: `train_utils.parse_configuration`, its Task,
  `train_lib.run_experiment(train_and_eval, run_post_eval=True)`, seeded
  and with deterministic ops as `runtime.deterministic` runs ours.

  Returns:
    (its Task, its trained model, its final evaluation's results).
  """
  # pylint: disable=g-import-not-at-top
  from official.core import task_factory
  from official.core import train_lib
  from official.core import train_utils
  tf_keras.utils.set_random_seed(0)
  tf.config.experimental.enable_op_determinism()
  params = train_utils.parse_configuration(
      train_utils.ParseConfigOptions(
          experiment=experiment, config_file=list(config_files),
          params_override=params_override), print_return=False)
  strategy = (tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(replicas)]) if replicas > 1
              else tf.distribute.get_strategy())
  with strategy.scope():
    task = task_factory.get_task(params.task, logging_dir=model_dir)
  model, results = train_lib.run_experiment(
      strategy, task, "train_and_eval", params, model_dir,
      run_post_eval=True)
  return task, model, {name: float(value) for name, value in results.items()}


def our_weights(task, model_dir: str):
  """The weights of our newest checkpoint, restored into the Model Garden
  Task's model as Model Garden restores one (`Checkpoint(model=...)`)."""
  model = task.build_model()
  status = tf.train.Checkpoint(model=model).read(
      tf.train.latest_checkpoint(model_dir))
  status.expect_partial().assert_existing_objects_matched()
  return [w.numpy() for w in model.weights]


def our_results(model_dir: str):
  """Our last evaluation's results, from its summaries (float32)."""
  scalars = helpers.read_scalars(os.path.join(model_dir, "eval"))
  return {tag: values[-1][1] for tag, values in scalars.items()}


def weight_difference(ours, theirs) -> float:
  assert len(ours) == len(theirs)
  return max(float(np.max(np.abs(a - b), initial=0.0))
             for a, b in zip(ours, theirs))


def scale(weights) -> float:
  return max([1.0] + [float(np.max(np.abs(w), initial=0.0))
                      for w in weights])


# Ours name Model Garden's results as they are, but for the loss.
SAME_RESULT = {"validation_loss": "loss",
               "loss": model_garden.REDUCED_LOSS}


def compare_results(theirs, ours):
  """Each of Model Garden's results against ours; returns the largest
  relative difference."""
  largest = 0.0
  for name, value in theirs.items():
    if name == "steps_per_second":
      continue
    mine = ours[SAME_RESULT.get(name, name)]
    largest = max(largest, _relative(value, mine))
  return largest


def against_model_garden(experiment: str, config_file, ours_dir, theirs_dir,
                         replicas: int = 1):
  """Model Garden's own run of `experiment` (`model_garden_run`) against
  ours in `ours_dir`; prints both.

  Returns:
    (the largest weight difference relative to the largest weight (at
    least 1), Model Garden's final results, ours).
  """
  task, model, theirs = model_garden_run(experiment, [str(config_file)], None,
                                         str(theirs_dir), replicas=replicas)
  weights = [w.numpy() for w in model.weights]
  difference = weight_difference(our_weights(task, str(ours_dir)), weights)
  ours = our_results(str(ours_dir))
  print(f"{experiment} | max abs weight difference {difference:g}; Model "
        f"Garden {theirs}; ours {ours}")
  return difference / scale(weights), theirs, ours


# The peer check on the mock experiment.


@pytest.mark.slow  # Two trainings of 200 steps and Model Garden's own: over 10 s.
def test_mock_experiment_ends_as_model_garden_ends_it(tmp_path):
  gin.parse_config_file(os.path.join(helpers.REPO_ROOT, MOCK_GIN))
  config_file = os.path.join(
      helpers.REPO_ROOT, gin.query_parameter("model_garden_task.config_file"))
  gin.clear_config()
  ours_dir, theirs_dir = tmp_path / "ours", tmp_path / "theirs"
  run = helpers.run_cli([f"--gin_file={MOCK_GIN}", f"--model_dir={ours_dir}",
                         "--gin_param=runtime.deterministic=True"])
  assert run.returncode == 0, run.stderr[-3000:]
  assert "model garden | experiment 'mock': " in run.stdout
  assert "config |" not in run.stdout  # Nothing bound against it.
  task, model, theirs = model_garden_run("mock", [config_file], None,
                                         str(theirs_dir))
  weights = [w.numpy() for w in model.weights]
  difference = weight_difference(our_weights(task, str(ours_dir)), weights)
  ours = our_results(str(ours_dir))
  print(f"mock | max abs weight difference {difference:g}; Model Garden "
        f"{theirs}; ours {ours}")
  assert difference <= TOLERANCE * scale(weights)
  # Its `counter` and summed `loss` come from its aggregate_logs and
  # reduce_aggregated_logs.
  assert {"acc", "validation_loss", "loss", "counter"} <= set(theirs)
  assert compare_results(theirs, ours) <= TOLERANCE
  assert theirs["counter"] == 10.0


# The peer check on official.vision's image classification.


def write_image_records(directory: str) -> None:
  """32 training examples in two files and 12 for validation: 40x40 JPEGs
  (cropped to 32x32) of noise, the label's colour channel lit, written with
  Model Garden's `tfexample_utils`."""
  # pylint: disable=g-import-not-at-top
  from official.vision.data import tf_example_builder
  from official.vision.dataloaders import tfexample_utils
  rng = np.random.RandomState(0)

  def examples(count):
    made = []
    for i in range(count):
      label = i % 2
      image = rng.randint(0, 256, size=(40, 40, 3)).astype(np.uint8)
      image[..., label] = np.maximum(image[..., label], 160)
      made.append(tf_example_builder.TfExampleBuilder()
                  .add_image_matrix_feature(image, "JPEG", b"0")
                  .add_ints_feature(tfexample_utils.CLASSIFICATION_LABEL_KEY,
                                    [label]).example)
    return made

  for shard in range(2):
    tfexample_utils.dump_to_tfrecord(
        os.path.join(directory, f"train-{shard}.tfrecord"), examples(16))
  tfexample_utils.dump_to_tfrecord(
      os.path.join(directory, "val-0.tfrecord"), examples(12))


VISION_YAML = """\
task:
  model:
    num_classes: 2
    input_size: [32, 32, 3]
    backbone:
      type: resnet
      resnet: {{model_id: 10, depth_multiplier: 0.25}}
    # The same statistics on every replica: the moving ones (synchronised on
    # read, averaged when saved) then resume exactly on replicas too.
    norm_activation: {{use_sync_bn: true}}
  losses: {{one_hot: true, l2_weight_decay: 0.0001}}
  train_data:
    input_path: {data}/train-*
    global_batch_size: 8
    is_training: true
    seed: 1
    aug_rand_hflip: false
    aug_crop: false
    shuffle_buffer_size: 32
  validation_data:
    input_path: {data}/val-*
    global_batch_size: 4
    is_training: false
trainer:
  train_steps: 6
  steps_per_loop: 3
  summary_interval: 3
  checkpoint_interval: 3
  validation_interval: 6
  validation_steps: -1
  optimizer_config:
    optimizer: {{type: sgd, sgd: {{momentum: 0.9}}}}
    learning_rate: {{type: constant, constant: {{learning_rate: 0.02}}}}
"""

VISION_GIN = """\
import official.vision.configs.image_classification
import official.vision.tasks.image_classification
experiment.task = @model_garden_task()
model_garden_task.experiment = "image_classification"
model_garden_task.config_file = "experiment.yaml"
runtime.deterministic = True
"""
# Two replicas, as Model Garden's run below has them.
MIRRORED = "--gin_file=gin/runtime/cpu_mirrored.gin"


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
  """A directory with the records, the experiment's YAML and our gin file;
  our uninterrupted run of it in `ours`."""
  base = tmp_path_factory.mktemp("vision")
  os.makedirs(base / "data")
  write_image_records(str(base / "data"))
  (base / "experiment.yaml").write_text(VISION_YAML.format(
      data=base / "data"))
  (base / "vision.gin").write_text(VISION_GIN)
  run = helpers.run_cli(["--gin_file=vision.gin", MIRRORED,
                         f"--model_dir={base}/ours"], cwd=str(base))
  assert run.returncode == 0, run.stderr[-3000:]
  return base


@pytest.mark.slow
def test_image_classification_ends_as_model_garden_ends_it(vision):
  difference, theirs, ours = against_model_garden(
      "image_classification", vision / "experiment.yaml", vision / "ours",
      vision / "theirs", replicas=2)
  assert difference <= TOLERANCE
  assert {"accuracy", "top_5_accuracy", "validation_loss"} <= set(theirs)
  assert compare_results(theirs, ours) <= TOLERANCE
  # Each train summary's mean loss over 2 replicas: its `training_loss`,
  # the mean of the replicas' losses, and ours, their sum once the adapter
  # divided each by 2.
  their_loss = helpers.read_scalars(str(vision / "theirs" / "train"))[
      "training_loss"]
  our_loss = helpers.read_scalars(str(vision / "ours" / "train"))["loss"]
  assert [step for step, _ in our_loss] == [step for step, _ in their_loss]
  for (_, a), (_, b) in zip(their_loss, our_loss):
    assert _relative(a, b) <= TOLERANCE


@pytest.mark.slow
def test_image_classification_resumes_exactly(vision):
  # Stopped at step 3, then resumed to 6: the checkpointed input position,
  # model and optimizer continue where the uninterrupted run went.
  interrupted = str(vision / "interrupted")
  first = helpers.run_cli(["--gin_file=vision.gin", MIRRORED,
                           f"--model_dir={interrupted}",
                           "--gin_param=trainer.train_steps=3"],
                          cwd=str(vision))
  assert first.returncode == 0, first.stderr[-3000:]
  assert ("config | `trainer.train_steps` = 3 (gin) over the experiment's "
          "`trainer.train_steps` (6)") in first.stdout
  second = helpers.run_cli(["--gin_file=vision.gin", MIRRORED,
                            f"--model_dir={interrupted}"], cwd=str(vision))
  assert second.returncode == 0, second.stderr[-3000:]
  assert "skips the" not in second.stdout  # The iterator was checkpointed.
  task = model_garden.model_garden_task(
      "image_classification", str(vision / "experiment.yaml")).garden
  assert weight_difference(our_weights(task, interrupted),
                           our_weights(task, str(vision / "ours"))) == 0.0


@pytest.mark.slow
def test_check_task_passes_the_experiment(vision):
  # Replica-invariant with its batch norm synchronised (Model Garden's
  # `use_sync_bn`); each replica otherwise normalises its own 4 examples,
  # which the check names. (At the default SGD rate, 0.05, a ResNet on
  # 4 + 4 examples amplifies the all-reduce's rounding past the tolerance
  # within 6 steps: 0.004.)
  check_task = os.path.join(helpers.REPO_ROOT, "scripts", "check_task.py")
  result = subprocess.run(
      [sys.executable, check_task, "--gin_file=vision.gin",
       "--learning_rate=0.01"],
      cwd=str(vision), capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
  for check in ("input", "replicas", "resume", "eval"):
    assert f"PASS {check}:" in result.stdout
  unsynchronized = subprocess.run(
      [sys.executable, check_task, "--gin_file=vision.gin",
       "--learning_rate=0.01", "--gin_param=model_garden_task."
       "params_override='task.model.norm_activation.use_sync_bn=false'"],
      cwd=str(vision), capture_output=True, text=True, timeout=600)
  assert unsynchronized.returncode == 1
  assert ("BatchNormalization layer 'batch_normalization' normalises each "
          "replica's batch on its own") in unsynchronized.stdout


# The peer check on official.nlp's BERT sentence prediction.


def write_sentence_records(directory: str) -> None:
  """64 training and 16 validation examples of 8 token ids, in the TFRecord
  layout of Model Garden's sentence-prediction reader; the label says
  whether the first two ids sum past 100."""
  rng = np.random.RandomState(0)

  def write(path, count):
    def ints(values):
      return tf.train.Feature(int64_list=tf.train.Int64List(
          value=np.ravel(values)))
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(count):
        ids = rng.randint(1, 100, size=8)
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            "input_ids": ints(ids), "input_mask": ints(np.ones_like(ids)),
            "segment_ids": ints(np.zeros_like(ids)),
            "label_ids": ints([int(ids[:2].sum() > 100)])})
                                      ).SerializeToString())

  write(os.path.join(directory, "train.tfrecord"), 64)
  write(os.path.join(directory, "val.tfrecord"), 16)


BERT_YAML = """\
task:
  metric_type: f1
  model:
    num_classes: 2
    encoder:
      type: bert
      bert: {{vocab_size: 100, hidden_size: 32, num_layers: 2,
             num_attention_heads: 2, intermediate_size: 64,
             max_position_embeddings: 8}}
  train_data: {{input_path: {data}/train.tfrecord, seq_length: 8,
               global_batch_size: 8, is_training: true, seed: 1,
               shuffle_buffer_size: 64}}
  validation_data: {{input_path: {data}/val.tfrecord, seq_length: 8,
                    global_batch_size: 8, is_training: false}}
trainer:
  train_steps: 10
  steps_per_loop: 10
  summary_interval: 10
  checkpoint_interval: 10
  validation_interval: 10
  validation_steps: -1
  optimizer_config:
    learning_rate: {{polynomial: {{initial_learning_rate: 0.001,
                                 decay_steps: 10}}}}
    warmup: {{polynomial: {{warmup_steps: 2}}}}
"""

BERT_GIN = """\
import official.common.registry_imports
experiment.task = @model_garden_task()
model_garden_task.experiment = "bert/sentence_prediction"
model_garden_task.config_file = "experiment.yaml"
runtime.deterministic = True
"""
# The BERT's largest weight difference allowed, relative to the largest
# weight (at least 1): not bit-identical, as Grappler rewrites the two
# compiled loops differently (docs/coming-from-model-garden.md). Measured
# after 10 steps: 1.2e-7; with Grappler off on both sides, 0.0.
BERT_TOLERANCE = 1e-6


@pytest.mark.slow  # Our 10 steps and Model Garden's: about 25 s.
def test_bert_sentence_prediction_ends_as_model_garden_ends_it(tmp_path):
  os.makedirs(tmp_path / "data")
  write_sentence_records(str(tmp_path / "data"))
  (tmp_path / "experiment.yaml").write_text(BERT_YAML.format(
      data=tmp_path / "data"))
  (tmp_path / "bert.gin").write_text(BERT_GIN)
  run = helpers.run_cli(["--gin_file=bert.gin", "--model_dir=ours"],
                        cwd=str(tmp_path))
  assert run.returncode == 0, run.stderr[-3000:]
  # Keras's two notices about this model are said once each, harmless
  # here; stderr holds neither (nor anything of TensorFlow's).
  assert ("warning | Input dict contained keys ['label_ids'] which did not "
          "match any model input: the model ignores them\n") in run.stdout
  assert ("warning | Gradients do not exist for variables "
          "['pooler_transform/kernel:0', 'pooler_transform/bias:0']: the "
          "loss does not depend on them, so they do not train\n"
          ) in run.stdout
  assert run.stdout.count("warning | Gradients do not exist") == 1
  assert run.stderr == ""
  import official.common.registry_imports  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  difference, theirs, ours = against_model_garden(
      "bert/sentence_prediction", tmp_path / "experiment.yaml",
      tmp_path / "ours", tmp_path / "theirs")
  assert difference <= BERT_TOLERANCE
  assert {"f1", "cls_accuracy", "auc", "validation_loss"} <= set(theirs)
  assert compare_results(theirs, ours) <= BERT_TOLERANCE


# The rule where both sides set something.


def test_the_experiment_sets_what_gin_does_not_bind(capsys):
  task, runtime, config = gin_config.load_config([MOCK_GIN], [])
  assert (config.train_steps, config.steps_per_loop,
          config.validation_interval, config.validation_steps,
          config.global_batch_size, config.eval_batch_size) == (
              200, 50, 100, 10, 8, 8)
  # Model Garden's defaults are the experiment's values too.
  assert config.max_to_keep == 5 and config.checkpoint_interval == 100
  assert runtime.mixed_precision_dtype == "float32"  # Unset there.
  assert "config |" not in capsys.readouterr().out
  assert isinstance(task, model_garden.ModelGardenTask)


def test_a_gin_binding_wins_and_says_so(capsys):
  task, runtime, config = gin_config.load_config([MOCK_GIN], [
      "trainer.train_steps=300", "trainer.global_batch_size=4",
      "trainer.max_to_keep=5", 'runtime.mixed_precision_dtype="bfloat16"'])
  lines = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith("config |")]
  assert lines == [
      "config | `trainer.train_steps` = 300 (gin) over the experiment's "
      "`trainer.train_steps` (200)",
      "config | `trainer.global_batch_size` = 4 (gin) over the "
      "experiment's `task.train_data.global_batch_size` (8)"]
  assert config.train_steps == 300 and config.global_batch_size == 4
  assert runtime.mixed_precision_dtype == "bfloat16"
  # Written into the experiment: its reader batches what the loop trains.
  assert task.params.trainer.train_steps == 300
  assert task.params.task.train_data.global_batch_size == 4
  assert task.params.runtime.mixed_precision_dtype == "bfloat16"


def test_settings_from_the_experiment_are_named_where_they_fail():
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.load_config([MOCK_GIN], ["trainer.steps_per_loop=30"])
  assert str(raised.value) == (
      "`trainer.summary_interval` (50) must be a multiple of "
      "`trainer.steps_per_loop` (30). (`trainer.summary_interval` from the "
      "experiment's `trainer.summary_interval`)")


def test_placement_and_unread_fields_of_the_experiment_are_named(capsys):
  gin_config.load_config([MOCK_GIN], [
      "model_garden_task.params_override='runtime.distribution_strategy="
      "tpu,trainer.loss_upper_bound=10.0'"])
  lines = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith("config |")]
  assert lines == [
      "config | the experiment's `runtime.distribution_strategy` ('tpu') is "
      "not used: `runtime.distribution_strategy` ('default') places the "
      "run, as for every Task (gin/runtime/*.gin)",
      "config | the experiment's `trainer.loss_upper_bound` (10.0) is not "
      "used here: `trainer.on_nonfinite` handles a non-finite loss"]


def test_the_experiments_ema_and_best_checkpoint_become_ours(capsys):
  override = ("{trainer: {optimizer_config: {ema: {average_decay: 0.9}}, "
              "best_checkpoint_export_subdir: best, "
              "best_checkpoint_eval_metric: validation_loss, "
              "best_checkpoint_metric_comp: lower}}")
  task, _, config = gin_config.load_config(
      [MOCK_GIN], [f'model_garden_task.params_override="{override}"'])
  assert config.ema.decay == 0.9 and config.ema.dynamic_decay
  assert task.params.trainer.optimizer_config.ema is None  # Ours runs it.
  assert config.best_checkpoint.metric == "loss"
  assert config.best_checkpoint.higher_is_better is False
  gin.clear_config()
  task, _, config = gin_config.load_config(
      [MOCK_GIN], [f'model_garden_task.params_override="{override}"',
                   "ema.decay=0.5"])
  assert config.ema.decay == 0.5
  assert ("config | `ema.decay` = 0.5 (gin) over the experiment's "
          "`trainer.optimizer_config.ema.average_decay` (0.9)"
          in capsys.readouterr().out)


@pytest.mark.parametrize("binding,message", [
    ('optimizer.name="adam"',
     "`optimizer.name` does not apply to a Model Garden Task: its optimizer "
     "is the experiment's `trainer.optimizer_config`"),
    ("trainer.gradient_clip_norm=1.0",
     "`trainer.gradient_clip_norm` (1.0) does not apply to a Model Garden "
     "Task, which runs its own `train_step`: clip in the experiment instead: "
     "`trainer.optimizer_config.optimizer.<type>.global_clipnorm`."),
])
def test_gin_settings_that_cannot_apply_are_refused(binding, message):
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.load_config([MOCK_GIN], [binding])
  assert message in str(raised.value)


def test_a_sweep_varies_an_experiment_field_through_params_override():
  # pylint: disable=g-import-not-at-top
  from trainer.sweeps import checks
  from trainer.sweeps import space as space_lib
  space = space_lib.parse_space([
      "model_garden_task.params_override=["
      "'trainer.optimizer_config.learning_rate.constant.learning_rate=0.1', "
      "'trainer.optimizer_config.learning_rate.constant.learning_rate=0.2']"])
  checks.load_trial_configs([MOCK_GIN], [], space)
  gin.clear_config()
  for choice, value in zip(space[0].choices, (0.1, 0.2)):
    # As a trial gets it: `--gin_param=BINDING=CHOICE`.
    task, _, _ = gin_config.load_config(
        [MOCK_GIN], [f"{space[0].binding}={choice}"])
    assert task.params.trainer.optimizer_config.learning_rate.constant\
        .learning_rate == value
    gin.clear_config()


# Bad input: one line, exit 2, nothing written.


# A train.py process each (~8 s), with the slow tests: the unknown
# experiment's lines are checked in-process below, and
# test_model_gardens_own_flags_say_where_they_go keeps a Model Garden
# train.py process that fails in the default suite.
@pytest.mark.parametrize("binding,line", [
    pytest.param(
        'model_garden_task.experiment="mokc"',
        "train.py: error: `model_garden_task.experiment`: no Model Garden "
        "experiment 'mokc' is registered (did you mean 'mock'?). An "
        "experiment is registered when its module is imported: add its "
        "`import` line to the gin file (`import "
        "official.common.registry_imports` registers all of Model Garden's).",
        marks=pytest.mark.slow),
    pytest.param(  # A second train.py process (~5 s): with the slow tests.
        "model_garden_task.params_override='trainer.train_stepz=5'",
        "train.py: error: `model_garden_task.params_override`: Model Garden "
        "refuses it: KeyError: The key 'train_stepz' does not exist in <class "
        "'official.core.config_definitions.TrainerConfig'>.",
        marks=pytest.mark.slow),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, binding, line):
  model_dir = tmp_path / "run"
  run = helpers.run_cli([f"--gin_file={MOCK_GIN}", f"--gin_param={binding}",
                         f"--model_dir={model_dir}"])
  assert run.returncode == 2
  assert run.stderr.strip().splitlines()[-1] == line
  assert not model_dir.exists()


# A train.py process (~8 s); the lines it names are checked in-process
# below (test_an_unregistered_experiment_names_the_import_it_needs).
@pytest.mark.slow
def test_a_gin_file_that_imports_no_experiment_says_to_import_it(tmp_path):
  # Nothing of Model Garden is imported before gin locks the configuration:
  # the adapter's own first import of it must still work (a user's trial
  # got gin's "Attempted to add a new configurable after the config was
  # locked" instead of this line). Model Garden's NLP experiment: the line
  # names the import that registers it (not official.vision's).
  (tmp_path / "no_import.gin").write_text(
      "experiment.task = @model_garden_task()\n"
      'model_garden_task.experiment = "bert/sentence_prediction"\n')
  run = helpers.run_cli(["--gin_file=no_import.gin", "--model_dir=run"],
                        cwd=str(tmp_path))
  assert run.returncode == 2
  assert run.stderr.strip().splitlines()[-1] == (
      "train.py: error: `model_garden_task.experiment`: Model Garden's "
      "experiment 'bert/sentence_prediction' is not registered: add `import "
      "official.common.registry_imports` to the gin file (an experiment is "
      "registered when its module is imported).")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name,line", [
    ("image_classification",
     "`model_garden_task.experiment`: Model Garden's experiment "
     "'image_classification' is not registered: add `import "
     "official.vision.registry_imports` to the gin file (an experiment is "
     "registered when its module is imported)."),
    ("bert/sentence_predicton",
     "`model_garden_task.experiment`: no Model Garden experiment "
     "'bert/sentence_predicton' is registered (did you mean "
     "'bert/sentence_prediction', registered by `import "
     "official.common.registry_imports`?). An experiment is registered when "
     "its module is imported: add its `import` line to the gin file (`import "
     "official.common.registry_imports` registers all of Model Garden's)."),
    ("my_exp",
     "`model_garden_task.experiment`: no Model Garden experiment 'my_exp' "
     "is registered; 1 is registered (mock). An experiment is registered "
     "when its module is imported: add its `import` line to the gin file "
     "(`import official.common.registry_imports` registers all of Model "
     "Garden's)."),
])
def test_an_unregistered_experiment_names_the_import_it_needs(
    monkeypatch, name, line):
  # What the gin file's imports registered (the mock alone) and what Model
  # Garden's own modules register, as the adapter reads them.
  monkeypatch.setattr(model_garden, "_registry", lambda: {"mock": None})
  monkeypatch.setattr(model_garden, "_model_gardens_experiments", lambda: {
      "mock": model_garden.ALL_EXPERIMENTS,
      "image_classification": model_garden.VISION_EXPERIMENTS,
      "bert/sentence_prediction": model_garden.ALL_EXPERIMENTS})
  assert str(model_garden._unknown_experiment(name)) == line  # pylint: disable=protected-access


def test_model_gardens_own_flags_say_where_they_go(tmp_path):
  run = helpers.run_cli([f"--gin_file={MOCK_GIN}", "--experiment=mock",
                         f"--model_dir={tmp_path / 'run'}"])
  assert run.returncode == 2
  assert run.stderr.strip().splitlines()[-1] == (
      "train.py: error: Unknown command line flag 'experiment': Model "
      "Garden's --experiment is the gin binding `model_garden_task."
      "experiment` here (--gin_param='model_garden_task.experiment=...'; "
      "docs/coming-from-model-garden.md)")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kwargs,message", [
    (dict(experiment="mock", config_file="missing.yaml"),
     "`model_garden_task.config_file`: no such file: missing.yaml"),
    (dict(experiment="mock", params_override="{trainer: [1, 2"),
     "`model_garden_task.params_override`: Model Garden refuses it: "
     "ParserError: while parsing a flow sequence"),
    (dict(experiment=""), "`model_garden_task.experiment` ('') must be the "
     "name of a registered Model Garden experiment."),
])
def test_experiment_configs_are_checked(kwargs, message):
  import official.utils.testing.mock_task  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  with pytest.raises(errors.ConfigError) as raised:
    model_garden.experiment_config(**kwargs)
  assert str(raised.value).startswith(message)
  assert "\n" not in str(raised.value)


def test_a_config_file_at_a_url_is_read_there(tmp_path, monkeypatch):
  """`config_file = 'gs://...'` (here `ram://`), not a local `gs:` path."""
  import official.utils.testing.mock_task  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  monkeypatch.chdir(tmp_path)
  path = f"ram://{tmp_path.name}/experiment.yaml"
  files.write_text(path, "trainer:\n  train_steps: 30\n")
  params = model_garden.experiment_config("mock", config_file=path)
  assert params.trainer.train_steps == 30
  with pytest.raises(errors.ConfigError) as raised:
    model_garden.experiment_config("mock", config_file=path + ".missing")
  assert str(raised.value) == (
      f"`model_garden_task.config_file`: no such file: {path}.missing")
  assert not os.listdir(tmp_path)


# A user's own experiment, reached through a gin `import`.

USER_EXPERIMENT = '''
import dataclasses

import numpy as np
import tensorflow as tf
import tf_keras
from official.core import base_task
from official.core import config_definitions as cfg
from official.core import exp_factory
from official.core import task_factory
from official.modeling import optimization


@dataclasses.dataclass
class SumConfig(cfg.TaskConfig):
  num_examples: int = 256


class Picked(tf_keras.Model):
  """Reads the features of a dict element."""

  def __init__(self):
    super().__init__()
    self.dense = tf_keras.layers.Dense(1)

  def call(self, inputs):
    return self.dense(inputs["x"])


@task_factory.register_task_cls(SumConfig)
class SumTask(base_task.Task):
  """Its elements are dicts, its validation sums an aggregate."""

  def build_model(self):
    return Picked()

  def build_inputs(self, params, input_context=None):
    rng = np.random.RandomState(0 if params.is_training else 1)
    x = rng.normal(size=(self.task_config.num_examples, 4)).astype("float32")
    y = x.sum(1, keepdims=True)
    dataset = tf.data.Dataset.from_tensor_slices({"x": x, "y": y})
    if params.is_training:
      # Read through Python: its position cannot be checkpointed.
      dataset = tf.data.Dataset.from_generator(
          lambda: ({"x": a, "y": b} for a, b in zip(x, y)),
          output_signature=dataset.element_spec)
      dataset = dataset.shuffle(64, seed=params.seed).repeat()
    size = (input_context.get_per_replica_batch_size(params.global_batch_size)
            if input_context else params.global_batch_size)
    return dataset.batch(size, drop_remainder=params.drop_remainder)

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.reduce_mean(tf.square(labels["y"] - model_outputs))

  def validation_step(self, inputs, model, metrics=None):
    logs = super().validation_step(inputs, model, metrics)
    logs["examples"] = tf.shape(inputs["x"])[0]
    return logs

  def aggregate_logs(self, state, step_outputs):
    state = state or {"examples": 0, "steps": 0}
    state["examples"] += int(sum(int(v) for v in step_outputs["examples"]))
    state["steps"] += len(step_outputs["loss"])
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    return {"examples": float(aggregated_logs["examples"]),
            "loss": float(aggregated_logs["steps"])}


@exp_factory.register_config_factory("sum_regression")
def sum_regression():
  return cfg.ExperimentConfig(
      task=SumConfig(
          train_data=cfg.DataConfig(is_training=True, global_batch_size=16,
                                    seed=0),
          validation_data=cfg.DataConfig(is_training=False,
                                         global_batch_size=64,
                                         drop_remainder=False)),
      trainer=cfg.TrainerConfig(
          train_steps=40, steps_per_loop=20, summary_interval=20,
          checkpoint_interval=20, validation_interval=40,
          optimizer_config=optimization.OptimizationConfig({
              "optimizer": {"type": "sgd"},
              "learning_rate": {"type": "constant",
                                "constant": {"learning_rate": 0.05}}})))
'''

USER_GIN = '''
import sum_experiment
experiment.task = @model_garden_task()
model_garden_task.experiment = "sum_regression"
'''


@pytest.mark.slow  # Three train.py processes.
def test_a_users_registered_experiment_trains_and_resumes(tmp_path):
  (tmp_path / "sum_experiment.py").write_text(USER_EXPERIMENT)
  (tmp_path / "sum.gin").write_text(USER_GIN)
  run = helpers.run_cli(["--gin_file=sum.gin", "--model_dir=run"],
                        cwd=str(tmp_path))
  assert run.returncode == 0, run.stderr[-3000:]
  assert "model garden | experiment 'sum_regression': sum_experiment.SumTask"\
      in run.stdout
  final = run.stdout.split("final eval |")[1]
  # Every one of the 256 examples, in 4 batches, aggregated by its Task;
  # its `loss` result is the count of steps, reported as `reduced_loss`.
  assert "examples 256.0000" in final and "reduced_loss 4.0000" in final
  # The same command again resumes; more steps continue the run.
  again = helpers.run_cli(["--gin_file=sum.gin", "--model_dir=run",
                           "--gin_param=trainer.train_steps=60"],
                          cwd=str(tmp_path))
  assert again.returncode == 0, again.stderr[-3000:]
  assert ("run | ModelGardenTask, train_and_eval in run: resuming from "
          "ckpt-40, step 40") in again.stdout
  # Its reader's position is not in the checkpoint: said, and skipped to.
  assert "the training input cannot be checkpointed" in again.stdout
  assert ("input | resuming: skips the 40 batch(es) trained on before"
          in again.stdout)
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 60
