"""Implementation modules of kiln.autograd_trace; import the public names from the package."""
