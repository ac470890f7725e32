"""Privacy for federated rounds: secure aggregation and client-level differential privacy."""
