"""cutpoint.coordinator: the two-phase group snapshot protocol."""
