"""Implementation modules of kiln.codegen_triton (not a public API)."""
