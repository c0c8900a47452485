"""Built-in workloads (models and datasets), addressable as "module:factory"."""
