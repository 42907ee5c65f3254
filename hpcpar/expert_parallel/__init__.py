"""Expert parallelism: the experts of every MoE layer spread over ep ranks, tokens sent to
them and back by all-to-all (dispatch.py)."""
