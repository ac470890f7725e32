"""Pure-PyTorch building blocks: models, losses, aggregation and data partitioning."""
