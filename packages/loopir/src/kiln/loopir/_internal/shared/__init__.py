"""loopir's shared codegen layer (public as `kiln.loopir.codegen`)."""
