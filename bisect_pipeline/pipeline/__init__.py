"""The user's pipeline and its proxies: the entry contract, the loader read once, the dataset's transforms
split, recorded and replayed, the default step, the user's state kept, and the framework integrations.

See docs/development.md for the layers."""
