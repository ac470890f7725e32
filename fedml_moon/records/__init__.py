"""A run's output folder: its layout (`layout`: every file and folder name, the per-rank folders and
checkpoints, the atomic write and the reading of records), the rule that a new run never writes over
an earlier run's (`folder`), the round records, summary and pictures (`recorder`) and the trackers
(`tracking`: Weights & Biases, TensorBoard). Importing this package imports none of them."""
