"""zeromismatch.integrations."""
