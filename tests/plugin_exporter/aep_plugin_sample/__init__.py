"""A sample aep-collector plug-in (used by the plug-in tests, and as a template)."""
