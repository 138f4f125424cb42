"""Metadata lives in setup.cfg; this file lets older pips install in editable mode."""

from setuptools import setup

setup()
