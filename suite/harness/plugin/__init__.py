"""The pytest plugin that runs the suite: options, spec parametrization, outcomes, summary, xdist scheduling."""
