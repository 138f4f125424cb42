"""What to change and whether it helps: the advice's rules, its check and the confirmation in the
pipeline, --tune's search, the diagnosis of a run, and the settings written into a script.

See docs/development.md for the layers."""
