"""The distributed layer: the protocol (protocol.py), the FedML managers' common base (managers.py), the
server (server/: one state, its phases) and a silo (silo/: its state and members), deployment
(deploy.py) and the transports (transport/: MPI, gRPC, MQTT + S3)."""
