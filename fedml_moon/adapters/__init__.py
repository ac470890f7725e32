"""The adapters to FedML 0.9.6: its ClientTrainer (trainer.py) and ServerAggregator (aggregator.py), the
assembly of a run and FedMLRunner (run.py), and the compatibility shims (compat.py). With the
distributed layer, the only place that imports `fedml`."""
