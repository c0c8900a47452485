"""Engine processes seen from the pytest side: the pool that starts and calls them, cluster topology, agents, versions."""
