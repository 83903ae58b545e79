"""_pipeline."""
