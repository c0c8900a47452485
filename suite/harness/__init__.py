"""The pytest side, one room per job: engines/, drawing/, verdict/, loopcheck/, reporting/,
tools/, plugin/ (each package's docstring says its job). Nothing here imports TensorFlow."""
