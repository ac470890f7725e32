"""The distributed layer: the protocol (protocol.py), the FedML managers of the server and the workers
(managers.py, server_manager.py, client_manager.py), deployment (deploy.py) and the transports
(transport/: MPI, gRPC, MQTT + S3)."""
