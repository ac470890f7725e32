"""The round engine that standalone and distributed runs share: the server's rounds (rounds.py), the
parties' runner (parties.py), the standalone loop (simulation.py) and checkpoints / resume (resume.py).
Pure PyTorch: nothing here imports `fedml`."""
