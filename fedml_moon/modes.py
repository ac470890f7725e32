"""The modes a run can take, by their command-line names (`fedml-moon check --modes`)."""

MODES = ("standalone", "mpi-simulation", "cross-silo-mpi", "cross-silo-grpc", "mqtt-s3")
