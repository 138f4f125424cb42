"""Measuring: the plan of a visit's windows, the code that reads the clock, the caches and batch sources
of each point, the bisection's rounds, the stages timed alone and inside the augment stage.

See docs/development.md for the layers."""
