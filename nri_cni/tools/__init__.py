"""Developer tools (code generation); nothing here is imported at run time."""
