"""Code generation: validated specs -> view models -> Jinja templates -> files on disk."""
