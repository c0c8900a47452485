"""The pytest side: engine pool, cluster topology, agents, cases, checks, repro snippets,
deviations, benchmarks' method and the report. Nothing here imports TensorFlow."""
