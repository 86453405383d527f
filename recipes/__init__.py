"""Training recipes for the model-internal selectors (one module per method)."""
