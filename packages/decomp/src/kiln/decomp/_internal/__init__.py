"""Implementation modules of kiln.decomp; import the public names from ``kiln.decomp``."""
