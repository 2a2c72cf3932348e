"""Sweeps over gin bindings on Optuna: `scripts/sweep.py`'s parts.

Kept out of `trainer/` so the framework never imports Optuna: a trial is a
plain `train.py` process, and this package only launches and reads them.
"""
