"""Maintainers' tools: the benchmark method, the measured float32 error, the mutation matrix, two runs' outcomes compared."""
