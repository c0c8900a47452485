"""A user's training loop checked against itself on one device, under each strategy spec."""
