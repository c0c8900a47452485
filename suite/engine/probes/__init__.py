"""Probes: the TensorFlow computations run inside engines, one module per area.

Only engines import the modules here (they import TensorFlow); the pytest process names a
probe by its string ``"<area>.<name>"`` and gets plain data back.
"""
