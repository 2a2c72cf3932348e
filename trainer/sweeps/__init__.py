"""Sweeps over gin bindings on Optuna: `scripts/sweep.py`'s parts.

The top layer of `trainer`: nothing else in the framework imports it, so
training never imports Optuna (the `sweep` extra). A trial is a plain
`train.py` process; this package only launches and reads them.
"""
