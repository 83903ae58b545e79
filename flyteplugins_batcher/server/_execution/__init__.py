"""_execution."""
