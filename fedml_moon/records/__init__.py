"""A run's records: the rule that a new run never writes over an earlier run's (`folder`), the round
records, summary and pictures (`recorder`) and the trackers (`tracking`: Weights & Biases,
TensorBoard); the names of the files they write are the run folder's (`fedml_moon/run_folder.py`).
Importing this package imports none of them."""
