"""The collector core: component model, config, envelope stamping, control routing, service."""
