"""Implementation modules of kiln.capture; the public names are re-exported by the package."""
