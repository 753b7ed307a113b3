"""The console's widgets, one module each."""
