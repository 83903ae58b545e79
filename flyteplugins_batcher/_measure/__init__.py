"""_measure."""
