"""From comm_args to a transport's security: TLS on by default off loopback, silos authenticated,
and a clear error naming the key when something needed is missing."""

from __future__ import annotations

import os
from pathlib import Path

from fedml_moon.config.schema import CommArgs, ConfigError
from fedml_moon.distributed.transport.grpc_transport import GrpcSecurity
from fedml_moon.distributed.transport.mqtt_s3 import MqttSecurity
from fedml_moon.security import is_loopback, load_token_caps, load_token_table

TOKEN_ENV = "FEDML_MOON_TOKEN"
MQTT_PASSWORD_ENV = "FEDML_MOON_MQTT_PASSWORD"
CERTS_HINT = "create them with `fedml-moon certs DIR --silos N --host <server address>`"


def _read(c: CommArgs, key: str) -> bytes:
    path = getattr(c, key)
    if not path:
        raise ConfigError(f"comm_args.{key}: needed with TLS; {CERTS_HINT}")
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as err:
        raise ConfigError(f"comm_args.{key}: cannot read {path} ({err.strerror}); {CERTS_HINT}") from None


def _silo_token(c: CommArgs) -> str | None:
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    if c.token_path:
        try:
            return Path(c.token_path).expanduser().read_text().strip()
        except OSError as err:
            raise ConfigError(f"comm_args.token_path: cannot read {c.token_path} ({err.strerror})") from None
    return None


def grpc_security(c: CommArgs, rank: int, server_host: str) -> GrpcSecurity:
    """The security of rank `rank`'s gRPC transport to (or, for rank 0, at) `server_host`."""
    loopback = is_loopback(server_host)
    tls = c.tls == "on" or (c.tls == "auto" and not loopback)
    token = _silo_token(c) if rank != 0 else None
    has_tokens = bool(c.token_path) if rank == 0 else token is not None
    auth = c.auth if c.auth != "auto" else ("mtls" if tls else ("token" if has_tokens else "none"))
    if not loopback and (not tls or auth == "none"):
        raise ConfigError(
            f"comm_args.tls / comm_args.auth: {server_host} is not a loopback address, so the run needs TLS "
            f"and silo authentication (tls: auto or on, auth: mtls or token); {CERTS_HINT}"
        )
    if auth == "mtls" and not tls:
        raise ConfigError("comm_args.auth: mtls needs TLS (comm_args.tls: on)")
    sec = GrpcSecurity(tls=tls, auth=auth)
    if tls:
        sec.ca = _read(c, "tls_ca")
        if rank == 0 or auth == "mtls":
            sec.cert, sec.key = _read(c, "tls_cert"), _read(c, "tls_key")
    if auth == "token":
        if rank == 0:
            if not c.token_path:
                raise ConfigError("comm_args.token_path: the server needs server-tokens.json for auth: token")
            sec.tokens = load_token_table(c.token_path)
            sec.caps = load_token_caps(c.token_path)
        elif token is None:
            raise ConfigError(
                f"comm_args.token_path: auth: token needs this silo's token file (or ${TOKEN_ENV})"
            )
        sec.token = token
    return sec


def mqtt_security(c: CommArgs, rank: int) -> MqttSecurity:
    """TLS to the broker (on by default off loopback) and the user and password of this rank: user
    `comm_args.mqtt_username` (default `server` / `silo-<rank>`), password from
    $FEDML_MOON_MQTT_PASSWORD, else the silo's token (comm_args.token_path or $FEDML_MOON_TOKEN)."""
    loopback = is_loopback(c.mqtt_host)
    tls = c.tls == "on" or (c.tls == "auto" and not loopback)
    password = os.environ.get(MQTT_PASSWORD_ENV) or _silo_token(c)
    username = c.mqtt_username or ("server" if rank == 0 else f"silo-{rank}")
    if not loopback and (not tls or password is None):
        raise ConfigError(
            f"comm_args.tls / comm_args.token_path: the broker {c.mqtt_host} is not on loopback, so the run "
            f"needs TLS and a password (${MQTT_PASSWORD_ENV} or the silo's token); {CERTS_HINT}"
        )
    sec = MqttSecurity(tls=tls, username=username if password is not None else None, password=password)
    if tls:
        _read(c, "tls_ca")  # named now, with the fix, rather than deep in the TLS library
        sec.ca = str(Path(c.tls_ca).expanduser())
        if c.tls_cert and c.tls_key:
            sec.cert, sec.key = str(Path(c.tls_cert).expanduser()), str(Path(c.tls_key).expanduser())
    return sec
