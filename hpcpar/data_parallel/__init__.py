"""Data parallelism: the replicas protocol (protocol.py) and its two implementations - replicas that sum
their gradients in buckets (replicas.py: ZeRO 0-2) and fully sharded units (fsdp.py: ZeRO-3) - over one
flat buffer (flat.py); the model state each ZeRO stage holds (zero_memory.py)."""
