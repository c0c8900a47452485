"""Numpy reference semantics of distributed custom training loops (never imports TensorFlow).

Everything is computed in float64. Each function's docstring says which TensorFlow/Keras
contract it states and where that contract is written down.
"""
