"""trainer/sweeps/report.py and plot.py with a URL sweep directory:
results.csv and results.png land at the URL, where the lines say."""

import csv
import io
import os

from matplotlib import image as mpimg
import optuna

from trainer.storage import files
from trainer.sweeps import plot
from trainer.sweeps import report
from trainer.sweeps import space as space_lib
from trainer.sweeps import trial_run


def test_results_csv_and_png_land_at_the_url(url_sweep_dir):
  space = space_lib.parse_space(["a.b=[1, 2]"])
  distributions = {"a.b": space[0].distribution()}
  trials = [optuna.trial.create_trial(
      value=value, params={"a.b": b}, distributions=distributions,
      user_attrs={"steps": 40, "seconds": 1.5})
            for value, b in ((0.5, "1"), (0.75, "2"))]
  for number, trial in enumerate(trials):
    trial.number = number
  said = report.lines(trials, space, "accuracy", "maximize", ["x.gin"], [],
                      "train_and_eval", url_sweep_dir)
  train_py = os.path.relpath(trial_run.TRAIN_PY)
  assert said[-3:] == [
      f"sweep | results in {url_sweep_dir}/results.csv",
      f"sweep | accuracy against each binding in {url_sweep_dir}/"
      "results.png",
      f"best | trial 1 | accuracy 0.7500 | python {train_py} "
      "--gin_file=x.gin --gin_param=a.b=2 --mode=train_and_eval "
      f"--model_dir={url_sweep_dir}/trial-1"]
  rows = list(csv.DictReader(io.StringIO(
      files.read_text(f"{url_sweep_dir}/{report.CSV}"))))
  assert [(row["trial"], row["accuracy"], row["model_dir"])
          for row in rows] == [
      ("1", "0.75", f"{url_sweep_dir}/trial-1"),
      ("0", "0.5", f"{url_sweep_dir}/trial-0")]
  png = files.read_bytes(f"{url_sweep_dir}/{plot.PNG}")
  assert mpimg.imread(io.BytesIO(png), format="png").shape[:2] == (320, 400)
  assert files.listdir(url_sweep_dir) == [report.CSV, plot.PNG]
