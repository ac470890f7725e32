"""A worker (MPI simulation) or silo of every distributed mode: its manager, state and phases."""
