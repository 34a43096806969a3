"""Package data: the vendor-side JavaScript files (``aep-collector hooks VENDOR`` prints their paths)."""
