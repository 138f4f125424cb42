"""The foundations every layer uses and that import nothing of the package: errors, statistics over windows,
the walker over nested batches, failures by stage, and the typed records of what was measured.

See docs/development.md for the layers."""
