"""The frozen backbone and the selectors that read it."""
