"""The plugin's transports for FedML's MPI, GRPC and MQTT_S3 backends.

FedML 0.9.6's own implementations of these backends un-pickle what they receive, spin a core while
idle (GRPC) and lose messages (MQTT_S3); see docs/explanation/fedml-compat.md. These carry
the same `Message` objects between the same `FedMLCommManager` subclasses, as codec bytes
(safetensors + JSON), and block rather than poll while they wait.
"""
