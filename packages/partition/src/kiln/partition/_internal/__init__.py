"""Implementation modules of kiln.partition; import the public names from `kiln.partition`."""
