"""What the properties draw: hypothesis cases, the profiles that size them, the tally of draws."""
