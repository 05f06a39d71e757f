"""A module that fails while being imported."""

raise RuntimeError("import-time failure")
