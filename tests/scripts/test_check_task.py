"""scripts/check_task.py, run as a user runs it: on Tasks in a module outside
the repository, imported by a gin file next to it, from that directory.

Every check runs in its own process (the CPU split is process-wide),
started when a test first asks for it. The shipped digits task's check is
the command docs/tools.md and docs/writing-a-task.md show (their blocks are
marked as run here): its output is checked against the latter's.
"""

import os
import re
import subprocess
import sys
import textwrap
from typing import Dict, List

import pytest

import helpers

SCRIPT = os.path.join(helpers.REPO_ROOT, "scripts", "check_task.py")

MY_TASKS = textwrap.dedent('''\
    import gin
    import numpy as np
    import tensorflow as tf
    import tf_keras
    import trainer


    @gin.configurable
    class Regression(trainer.Task):

      def hidden_layers(self):
        return [tf_keras.layers.Dense(16, "tanh")]

      def build_model(self):
        return tf_keras.Sequential([tf_keras.Input((4,)),
                                    *self.hidden_layers(),
                                    tf_keras.layers.Dense(1)])

      def build_inputs(self, training, input_context=None):
        rng = np.random.RandomState(0 if training else 1)
        x = rng.normal(size=(256, 4)).astype(np.float32)
        y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32))[:, None]
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=1)

      def build_losses(self, labels, model_outputs, aux_losses=None):
        return tf.reduce_mean(tf.square(labels - model_outputs), axis=-1)


    @gin.configurable
    class Averaging(Regression):
      """Averages over the per-replica batch: the bug the check is for."""

      def train_step(self, inputs, model, optimizer, metrics=None):
        features, labels = inputs
        with tf.GradientTape() as tape:
          loss = tf.reduce_mean(
              self.build_losses(labels, model(features, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}


    @gin.configurable
    class PlainBatchNorm(Regression):

      def hidden_layers(self):
        return [tf_keras.layers.Dense(16, "tanh"),
                tf_keras.layers.BatchNormalization(name="plain_bn")]


    @gin.configurable
    class Dropout(Regression):

      def hidden_layers(self):
        return [tf_keras.layers.Dense(16, "tanh"),
                tf_keras.layers.Dropout(0.3)]


    @gin.configurable
    class Batched(Regression):

      def build_inputs(self, training, input_context=None):
        return super().build_inputs(training, input_context).batch(16)


    @gin.configurable
    class ScalarLoss(Regression):

      def build_losses(self, labels, model_outputs, aux_losses=None):
        return tf.reduce_mean(super().build_losses(labels, model_outputs))
    

    @gin.configurable
    class FlatLabels(Regression):
      """Labels of shape [batch] against outputs [batch, 1]."""

      def build_inputs(self, training, input_context=None):
        return super().build_inputs(training, input_context).map(
            lambda x, y: (x, y[0]))


    @gin.configurable
    class OwnMetrics(Regression):
      """Updates its eval metrics by name in its own validation_step."""

      def build_metrics(self, training=True):
        return [tf_keras.metrics.MeanAbsoluteError("mae")]

      def validation_step(self, inputs, model, metrics=None):
        features, labels = inputs
        outputs = model(features, training=False)
        {metric.name: metric for metric in metrics}["mae"].update_state(
            labels, outputs)
        return {"loss": self.build_losses(labels, outputs)}


    @gin.configurable
    class Mixed(Regression):
      """Trains on a 70/30 mixture of two sources by its own hook."""

      def build_inputs(self, training, input_context=None):
        if not training:
          return super().build_inputs(training, input_context)
        rng = np.random.RandomState(2)
        x = rng.normal(size=(64, 4)).astype(np.float32)
        y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32))[:, None] + 1.0
        shifted = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
            64, seed=2)
        return {"clean": super().build_inputs(training, input_context),
                "shifted": shifted}

      def mixture_rates(self):
        return {"clean": 0.7, "shifted": 0.3}


    @gin.configurable
    class Sets(Regression):
      """Two named evaluation sets of 101 and 40 examples."""

      def build_inputs(self, training, input_context=None):
        examples = super().build_inputs(training, input_context)
        if training:
          return examples
        return {"near": examples.take(101), "far": examples.skip(101).take(40)
                .map(lambda x, y: (2.0 * x, 2.0 * y))}


    @gin.configurable
    class BatchMeanMetric(Sets):
      """Reports the mean of each replica's batch mean: a figure that
      depends on how the batches are split over replicas."""

      def build_metrics(self, training=True):
        return [tf_keras.metrics.Mean("batch_mean")]

      def validation_step(self, inputs, model, metrics=None):
        features, labels = inputs
        losses = self.build_losses(labels, model(features, training=False))
        metrics[0].update_state(tf.reduce_mean(losses))
        return {"loss": losses}


    @gin.configurable
    class TwoModels(Regression):
      """Two models, two optimizers; model b's loss is averaged per replica."""

      def build_model(self):
        return {"a": super().build_model(), "b": super().build_model()}

      def train_step(self, inputs, model, optimizer, metrics=None):
        features, labels = inputs
        with tf.GradientTape(persistent=True) as tape:
          losses_a = self.build_losses(labels, model["a"](features))
          losses_b = self.build_losses(labels, model["b"](features))
          loss_a = tf.nn.compute_average_loss(losses_a)
          loss_b = tf.reduce_mean(losses_b)  # The bug, in one model only.
        trainer.minimize(tape, loss_a, model["a"].trainable_variables,
                         optimizer["a"])
        trainer.minimize(tape, loss_b, model["b"].trainable_variables,
                         optimizer["b"])
        return {"loss": loss_a}

      def validation_step(self, inputs, model, metrics=None):
        features, labels = inputs
        return {"loss": self.build_losses(labels, model["a"](features))}


    @gin.configurable
    class TwoModelsAveraging(TwoModels):
      """Both models' losses averaged per replica, both reported."""

      def train_step(self, inputs, model, optimizer, metrics=None):
        features, labels = inputs
        with tf.GradientTape(persistent=True) as tape:
          loss_a = tf.reduce_mean(
              self.build_losses(labels, model["a"](features)))
          loss_b = tf.reduce_mean(
              self.build_losses(labels, model["b"](features)))
        trainer.minimize(tape, loss_a, model["a"].trainable_variables,
                         optimizer["a"])
        trainer.minimize(tape, loss_b, model["b"].trainable_variables,
                         optimizer["b"])
        return {"loss": loss_a + loss_b}
''')

# Name -> a Task class of MY_TASKS, or a gin file of the repository.
CASES = {
    "correct": "Regression",
    "batch_norm": "PlainBatchNorm",
    "dropout": "Dropout",
    "batched": "Batched",
    "scalar_loss": "ScalarLoss",
    "flat_labels": "FlatLabels",
    "sets": "Sets",
}
# The tests of `batch_norm`, `dropout`, `batched` and `flat_labels` are slow
# too: a check_task.py process each (6-9 s), whose kind of failure the
# default run sees in `scalar_loss` (test_loss_scaling.py checks per-replica
# averaging in-process).
# Checked by slow tests (`slow_checks`): the shipped digits tasks, the
# several-model cases, each as long as three of the above, a mixture, a
# metric that fails on replicas and a Task's own validation step (each has
# a sibling above or an in-process test, test_loss_scaling.py's several
# models: the default suite stays within its bound).
SLOW_CASES = {
    "averaging": "Averaging",
    "own_metrics": "OwnMetrics",
    "two_models": "TwoModels",
    "digits": "gin/digits.gin",
    "pipeline": "gin/digits_pipeline.gin",
    "two_models_averaging": "TwoModelsAveraging",
    "mixture": "Mixed",
    "batch_mean": "BatchMeanMetric",
}


class Check:
  """`check_task.py` running in the background."""

  def __init__(self, directory: str, gin_file: str):
    self.process = subprocess.Popen(
        [sys.executable, SCRIPT, f"--gin_file={gin_file}"],
        cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    self._result = None

  def result(self):
    """Waits for the exit; returns (exit code, stdout lines, stderr)."""
    if self._result is None:
      stdout, stderr = self.process.communicate(timeout=300)
      self._result = (self.process.returncode, stdout.splitlines(), stderr)
    return self._result


class _Checks:
  """`checks[name]`: the check of a case, started when a test first asks
  for it. Not all at once: under pytest-xdist this module's tests are
  shared between two processes, and each would otherwise run every case."""

  def __init__(self, cases: Dict[str, str], user_dir):
    (user_dir / "my_task.py").write_text(MY_TASKS)
    self.cases, self.user_dir, self.started = cases, user_dir, {}

  def __getitem__(self, name: str) -> Check:
    if name not in self.started:
      task = self.cases[name]
      if task.endswith(".gin"):
        self.started[name] = Check(helpers.REPO_ROOT, task)
      else:
        (self.user_dir / f"{name}.gin").write_text(
            f"import my_task\nexperiment.task = @{task}()\n"
            "trainer.global_batch_size = 32\n")
        self.started[name] = Check(str(self.user_dir), f"{name}.gin")
    return self.started[name]

  def stop(self) -> None:
    for check in self.started.values():
      if check.process.poll() is None:
        check.process.kill()
        check.process.wait()


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> _Checks:
  started = _Checks(CASES, tmp_path_factory.mktemp("user"))
  yield started
  started.stop()


@pytest.fixture(scope="module")
def slow_checks(tmp_path_factory) -> _Checks:
  started = _Checks(SLOW_CASES, tmp_path_factory.mktemp("user"))
  yield started
  started.stop()


def line(lines: List[str], prefix: str) -> str:
  found = [text for text in lines if text.startswith(prefix)]
  assert len(found) == 1, (prefix, lines)
  return found[0]


def replica_figures(text: str) -> Dict[str, float]:
  """The step-1 losses, their ratio and the weight difference of a
  `replicas` line."""
  found = re.search(r"step 1 (\S+) / (\S+) \(ratio (\S+)\).*max weight "
                    r"difference (\S+) \(tolerance (\S+)\)", text)
  assert found, text
  return dict(zip(("one", "many", "ratio", "difference", "tolerance"),
                  map(float, found.groups())))


def test_a_correct_task_passes_with_its_figures(checks):
  code, lines, stderr = checks["correct"].result()
  assert code == 0, stderr[-2000:]
  assert lines[0] == ("check_task | Regression: 6 steps of SGD (learning "
                      "rate 0.05), global batch 32, 1 device vs 2 replicas")
  assert lines[1:4] == [
      "PASS build_inputs: single examples ((4,) float32, (1,) float32)",
      "PASS build_losses: per-example losses, shape [256]",
      "PASS input: two builds give the same first batch"]
  figures = replica_figures(line(lines, "PASS replicas: loss on 1 / 2 "
                                 "replicas: step 1 "))
  assert figures["one"] == pytest.approx(figures["many"], rel=1e-6)
  assert figures["ratio"] == 1.0
  assert figures["difference"] < 1e-6 and figures["tolerance"] >= 1e-4
  assert line(lines, "PASS resume: 3 step(s), checkpoint, restore").endswith(
      "3 step(s) vs 6 steps: max weight difference 0")
  # The bytes the resume check's checkpoint holds for the iterator.
  assert re.fullmatch(
      r"check_task \| input state: [\d.]+ (B|KB) in the checkpoint \(the "
      r"training iterator's position and buffers\)",
      line(lines, "check_task | input state: "))
  assert lines[-1] == ("check_task | PASS: Regression trains the same on 1 "
                       "and 2 replicas and resumes exactly")


@pytest.mark.slow
def test_a_mixture_is_checked_with_its_sampling_position(slow_checks):
  code, lines, stderr = slow_checks["mixture"].result()
  assert code == 0, stderr[-2000:]
  assert lines[1:3] == [
      "PASS build_inputs: a mixture of clean: single examples ((4,) "
      "float32, (1,) float32); shifted: single examples ((4,) float32, (1,) "
      "float32)",
      "PASS mixture: clean 0.7, shifted 0.3 (from `Mixed.mixture_rates`; a "
      "source that runs out starts over); the input and resume checks below "
      "read it"]
  assert line(lines, "PASS input: ") == (
      "PASS input: two builds give the same first batch")
  # The checkpoint holds the mixture's iterator: the resumed run reads the
  # same sources' examples in the same order.
  assert line(lines, "PASS resume: 3 step(s), checkpoint, restore").endswith(
      "3 step(s) vs 6 steps: max weight difference 0")
  assert lines[-1] == ("check_task | PASS: Mixed trains the same on 1 and 2 "
                       "replicas and resumes exactly")


@pytest.mark.slow  # A check_task.py run of three sets: 8 s.
def test_each_evaluation_set_is_checked_on_replicas(checks):
  code, lines, stderr = checks["sets"].result()
  assert code == 0, stderr[-2000:]
  for name in ("near", "far"):
    text = line(lines, f"PASS eval {name}: the same weights on 1 / 2 "
                "replicas: loss ")
    assert float(text.rsplit("max difference ", 1)[1]) < 1e-6, text
  assert lines[-1] == ("check_task | PASS: Sets trains the same on 1 and 2 "
                       "replicas and resumes exactly")
  # One unnamed set: one `eval` line.
  code, lines, stderr = checks["correct"].result()
  assert line(lines, "PASS eval: the same weights on 1 / 2 replicas: loss ")


@pytest.mark.slow
def test_a_metric_that_depends_on_the_split_fails_naming_it(slow_checks):
  code, lines, stderr = slow_checks["batch_mean"].result()
  assert code == 1, stderr[-2000:]
  failed = [text for text in lines if text.startswith("FAIL eval ")]
  assert failed, lines
  assert all("Likely cause: `batch_mean` depends on how the batches are "
             "split over replicas" in text for text in failed)
  assert lines[-1] == "check_task | FAIL: BatchMeanMetric"


@pytest.mark.slow
def test_per_replica_averaging_fails_naming_it(slow_checks):
  code, lines, _ = slow_checks["averaging"].result()
  assert code == 1
  failure = line(lines, "FAIL replicas: ")
  figures = replica_figures(failure)
  assert figures["ratio"] == pytest.approx(2.0, abs=1e-3)
  assert figures["many"] == pytest.approx(2 * figures["one"], rel=1e-3)
  assert figures["difference"] > 100 * figures["tolerance"]
  assert failure.endswith(
      ". Likely cause: the train_step averages the loss over the per-replica "
      "batch; divide by the global batch: tf.nn.compute_average_loss")
  # Its resume is exact: only the scaling is wrong.
  assert line(lines, "PASS resume: ").endswith("max weight difference 0")
  assert lines[-1] == "check_task | FAIL: Averaging"


@pytest.mark.slow  # See CASES.
def test_plain_batch_norm_fails_naming_the_layer(checks):
  code, lines, _ = checks["batch_norm"].result()
  assert code == 1
  failure = line(lines, "FAIL replicas: ")
  figures = replica_figures(failure)
  assert figures["difference"] > 10 * figures["tolerance"]
  assert abs(figures["ratio"] - 2) > 0.5  # Not the averaging bug.
  assert failure.endswith(
      ". Likely cause: BatchNormalization layer 'plain_bn' normalises each "
      "replica's batch on its own: use BatchNormalization(synchronized=True)")
  assert lines[-1] == "check_task | FAIL: PlainBatchNorm"


@pytest.mark.slow  # See CASES.
def test_stateful_dropout_fails_replicas_and_resume(checks):
  code, lines, _ = checks["dropout"].result()
  assert code == 1
  for check in ("replicas", "resume"):
    failure = line(lines, f"FAIL {check}: ")
    assert re.search(r"Likely cause: stateful random ops in the step "
                     r"\(RandomUniform \(\S+dropout\S+\)\): use "
                     r"tf.random.stateless_\* ops seeded from the step$",
                     failure), failure


@pytest.mark.slow  # See CASES.
def test_batched_inputs_fail_naming_build_inputs(checks):
  code, lines, _ = checks["batched"].result()
  assert code == 1
  assert lines[1:3] == [
      "FAIL build_inputs: `build_inputs` returns batched data (every "
      "element has a leading dimension of unknown size: (None, 4), (None, "
      "1)): return single examples and let the framework batch them (remove "
      "`.batch(...)`; batch sizes are `trainer.global_batch_size` and "
      "`trainer.eval_batch_size`).",
      "SKIP input, replicas, resume: fix build_inputs first"]


@pytest.mark.parametrize("case,task,message", [
    ("scalar_loss", "ScalarLoss",
     "ScalarLoss.build_losses returned a scalar: return per-example losses, "
     "shape [batch] (drop the final mean; the framework averages over the "
     "global batch)."),
    pytest.param(
        "flat_labels", "FlatLabels",
        "FlatLabels.build_losses: labels of shape [256] and outputs of shape "
        "[256, 1] broadcast into a [batch, batch] loss (each example's loss "
        "mixes every label): give the labels the outputs' shape (`labels = "
        "tf.reshape(labels, tf.shape(model_outputs))`) or drop the outputs' "
        "last axis of 1.", marks=pytest.mark.slow),
])
def test_wrong_losses_fail_naming_build_losses(checks, case, task, message):
  code, lines, _ = checks[case].result()
  assert code == 1
  assert line(lines, "FAIL build_losses: ") == f"FAIL build_losses: {message}"
  assert lines[-2:] == ["SKIP input, replicas, resume: fix build_losses first",
                        f"check_task | FAIL: {task}"]


def _page_blocks():
  """The blocks of docs/tools.md and docs/writing-a-task.md that check the
  shipped digits task."""
  import test_docs  # pylint: disable=g-import-not-at-top
  found = [block for page in ("docs/tools.md", "docs/writing-a-task.md")
           for block in test_docs.blocks(page)
           if "scripts/check_task.py --gin_file=gin/digits.gin" in block.text]
  assert [block.run_by for block in found] == [
      "tests/scripts/test_check_task.py"] * 2, found
  return found


@pytest.mark.slow
def test_the_shipped_digits_task_passes(slow_checks):
  blocks = _page_blocks()
  code, lines, stderr = slow_checks["digits"].result()
  assert code == 0, stderr[-2000:]
  # The pages' command is this case's, run from the repository's root.
  import test_docs  # pylint: disable=g-import-not-at-top
  for block in blocks:
    commands = [line.removeprefix("$ ")
                for line in test_docs._logical_lines(block.text)  # pylint: disable=protected-access
                if line.strip() and (block.language == "sh" or
                                     line.startswith("$ "))]
    assert commands == [
        f"python scripts/check_task.py --gin_file={SLOW_CASES['digits']}"]
    for expected in test_docs._expected_output(block):  # pylint: disable=protected-access
      pattern = test_docs.output_pattern(expected)
      assert any(pattern.search(line) for line in lines), (expected, lines)
  assert [text.split(":")[0] for text in lines[1:-1]] == [
      "PASS build_inputs", "PASS build_losses", "PASS input",
      "check_task | input state", "PASS replicas", "PASS resume",
      "PASS eval"]
  assert replica_figures(lines[5])["difference"] < 1e-6
  assert lines[-1].startswith("check_task | PASS: DigitsClassification")


@pytest.mark.slow
def test_validation_step_gets_the_eval_metrics_a_run_passes(slow_checks):
  code, lines, stderr = slow_checks["own_metrics"].result()
  assert code == 0, stderr[-2000:]
  assert lines[2] == "PASS validation_step: per-example losses, shape [256]"
  assert lines[-1] == ("check_task | PASS: OwnMetrics trains the same on 1 "
                       "and 2 replicas and resumes exactly")


@pytest.mark.slow
def test_a_pipelined_task_is_checked_whole_and_says_so(slow_checks):
  code, lines, stderr = slow_checks["pipeline"].result()
  assert code == 0, stderr[-2000:]
  assert lines[1] == (
      "SKIP pipeline: not checked; every check below runs the model whole, "
      "not cut at `pipeline.boundaries` (a pipeline cannot run on replicas)")
  assert [text.split(":")[0] for text in lines[2:-1]] == [
      "PASS build_inputs", "PASS build_losses", "PASS input",
      "check_task | input state", "PASS replicas", "PASS resume",
      "PASS eval"]
  assert replica_figures(lines[6])["difference"] < 1e-6
  assert lines[-1].startswith("check_task | PASS: DigitsPipelineMLP")


@pytest.mark.slow
def test_several_models_name_the_one_averaged_per_replica(slow_checks):
  code, lines, stderr = slow_checks["two_models"].result()
  assert code == 1, stderr[-2000:]
  assert line(lines, "PASS resume: ").endswith("max weight difference 0")
  failure = line(lines, "FAIL replicas: ")
  assert failure.endswith(
      "Likely cause: the update of 'b' differs with the replica count: its "
      "loss is likely averaged over each replica's examples, not the global "
      "batch (use tf.nn.compute_average_loss on per-example losses)"), failure


@pytest.mark.slow
def test_several_models_averaged_per_replica_give_the_cause_once(
    slow_checks):
  code, lines, stderr = slow_checks["two_models_averaging"].result()
  assert code == 1, stderr[-2000:]
  failure = line(lines, "FAIL replicas: ")
  figures = replica_figures(failure)
  assert figures["ratio"] == pytest.approx(2.0, abs=1e-3)
  number = r"[-+.e\d]+"
  assert re.fullmatch(
      rf"FAIL replicas: loss on 1 / 2 replicas: step 1 {number} / {number} "
      rf"\(ratio 2\.0000\), step 6 {number} / {number}; max weight "
      rf"difference {number} \(tolerance {number}\)\. Likely cause: the "
      r"train_step averages the loss over the per-replica batch \(the "
      r"update of 'a', 'b' differs with the replica count\); divide by the "
      r"global batch: tf\.nn\.compute_average_loss", failure), failure
  assert lines[-1] == "check_task | FAIL: TwoModelsAveraging"
