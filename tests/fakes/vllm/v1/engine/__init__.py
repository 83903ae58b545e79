"""Mirror of `vllm.v1.engine` (vLLM 0.33.0): the finish-reason strings."""

FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")
