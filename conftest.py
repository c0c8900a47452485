"""The root of the suite's own test session. Its hooks, options and fixtures are the plugin
``suite.harness.plugin.suite_plugin`` (and the mutation matrix's, loaded with ``-p`` where used);
this file only loads it, so that ``pytest tests`` and ``pytest benchmarks`` in a checkout get it."""

pytest_plugins = ["suite.harness.plugin.suite_plugin"]
