"""What follows from numbers alone (pure): each stage's drop predicted from its cost alone, the verdict
from the points and both witnesses, and the typed results the layers above fill in.

See docs/development.md for the layers."""
