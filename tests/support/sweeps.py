"""A sweep file the tests write: a tiny grid of MOON and FedAvg, two seeds each."""

TINY_GRID = """
base: {root}/config/fashion_mnist/{{algorithm}}.yaml
output: {out}
set:
  data_args.max_train_samples: 600
  data_args.max_test_samples: 200
  train_args.client_num_in_total: 3
  train_args.client_num_per_round: 3
  train_args.comm_round: {rounds}
  train_args.epochs: 1
  train_args.batch_size: 32
  train_args.learning_rate: 0.05
  train_args.checkpoint_every: 1
  tracking_args.enable_wandb: false
grid:
  train_args.algorithm: [moon, fedavg]
  common_args.random_seed: [0, 1]
"""
"""A sweep file's text: format it with the repository `root`, its `out` folder and the `rounds`."""
