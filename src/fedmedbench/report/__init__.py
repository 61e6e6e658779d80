"""Tables and figures built from run outputs."""
