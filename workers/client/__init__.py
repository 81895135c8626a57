"""The client side: start, watch and wait on runs."""
