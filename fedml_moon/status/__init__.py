"""A run's status: the record every process writes beside its records and `fedml-moon status` reads
(`record`), the status port that serves it (`http`), its page (`page`) and its Prometheus metrics
(`metrics`), and the bounded log of what a process refused, whose counts the status shows
(`refusals`). Importing this package imports none of them."""
