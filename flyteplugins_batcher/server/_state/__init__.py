"""_state."""
