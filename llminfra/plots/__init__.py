"""matplotlib figure functions (one module per chapter topic); the widgets and notebooks call them."""
