"""_http."""
