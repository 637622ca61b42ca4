"""Evidence below the application log: kernel lines, GPU health, and the decision that joins them."""
