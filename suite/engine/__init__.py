"""Engines: processes that run TensorFlow under one strategy spec (see docs/architecture.md)."""
