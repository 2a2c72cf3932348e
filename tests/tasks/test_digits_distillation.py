"""tasks.digits_distillation through `train.py`, as the gin file's header
says: a digits teacher trained first, then a student distilled from it, the
teacher restored by name and frozen."""

import numpy as np
import pytest
import tensorflow as tf

import helpers


@pytest.mark.slow
def test_a_student_learns_from_the_frozen_teacher(tmp_path):
  teacher = helpers.run_cli([f"--gin_file={helpers.REPO_ROOT}/gin/digits.gin",
                             "--model_dir=runs/teacher"], cwd=str(tmp_path))
  assert teacher.returncode == 0, teacher.stderr[-3000:]
  result = helpers.run_cli([
      f"--gin_file={helpers.REPO_ROOT}/gin/digits_distillation.gin",
      "--gin_param=TEACHER_CHECKPOINT=\"runs/teacher\"",
      "--gin_param=export.at_end=True", "--model_dir=runs/student"],
                           cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  assert ("warm start | model 'teacher': the whole model from "
          "runs/teacher/ckpt-1000") in lines
  # The teacher gets no optimizer: only the student is trained.
  assert [l for l in lines if l.startswith("optimizer |")] == [
      "optimizer | student: 4 variable(s), 2,410 parameters, Adam, rate "
      "0.003"]
  evals = helpers.read_scalars(str(tmp_path / "runs" / "student" / "eval"))
  teacher_evals = helpers.read_scalars(
      str(tmp_path / "runs" / "teacher" / "eval"))
  # The teacher evaluates exactly as in its own run, at every evaluation.
  for _, value in evals["teacher_accuracy"]:
    assert value == pytest.approx(teacher_evals["accuracy"][-1][1])
  assert evals["accuracy"][-1][0] == 2000 and evals["accuracy"][-1][1] >= 0.95
  # Frozen: its weights are the teacher run's, bit for bit.
  student = tf.train.load_checkpoint(str(tmp_path / "runs" / "student"))
  original = tf.train.load_checkpoint(str(tmp_path / "runs" / "teacher"))
  for name in original.get_variable_to_shape_map():
    if name.startswith("model/") and "OPTIMIZER_SLOT" not in name:
      np.testing.assert_array_equal(
          student.get_tensor(name.replace("model/", "model/teacher/", 1)),
          original.get_tensor(name), name)
  # The student is exported (`export.model`), and serves alone.
  served = tf.saved_model.load(
      str(tmp_path / "runs" / "student" / "export" / "2000"))
  outputs = served.signatures["serving_default"](
      features=tf.zeros([3, 8, 8, 1]))["outputs"]
  assert outputs.shape == (3, 10)
