"""The engine side: processes that run TensorFlow under one strategy spec (the worker main, the
strategy context, Keras compatibility, the train step, probes and workloads). Nothing here
imports ``reference``: an engine computes, the pytest side judges."""
