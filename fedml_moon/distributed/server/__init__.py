"""The server (rank 0) of every distributed mode: one manager, its state, and its phases."""
