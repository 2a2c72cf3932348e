"""Installs the `trainer` framework and the shipped `tasks`; see setup.cfg."""

import setuptools

setuptools.setup()
