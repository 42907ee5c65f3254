"""Data parallelism: replicas that average gradients (replicas.py) over flat gradient
buckets (buckets.py), and the ZeRO stages that shard them."""
