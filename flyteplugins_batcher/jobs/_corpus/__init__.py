"""_corpus."""
