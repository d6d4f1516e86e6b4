"""The agent's side of the mutual TLS: who may call it, and with which certificate it answers.

TLS alone (``require_client_auth`` against the CA) lets in any client
certificate the CA signed. ``ControlPlaneOnly`` also requires the verified
peer certificate to name the control plane, before any handler runs. (An
agent's own certificate is a server certificate: TLS refuses it as a client's.)
The serving certificate is read again from its files when they change
(``dynamic_ssl_server_credentials``), so a renewed certificate is used
without restarting the agent.

Serve mode only (imports grpc).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import grpc

from stortune.agent import identity
from stortune.api.agent import CONTROL_PLANE_NAME
from stortune.api.agent.tlsfiles import TLSFiles

log = logging.getLogger("stortune.agent.mtls")


def peer_names(context: grpc.ServicerContext) -> set[str]:
    """The names in the peer's certificate (CN and DNS SANs), which TLS has already verified
    against our CA (require_client_auth); empty without a client certificate."""
    auth = context.auth_context()
    names: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        # The stubs type the values loosely; gRPC hands over a list of bytes.
        values: list[bytes] = auth.get(key) or []  # type: ignore[assignment]
        names.update(v.decode("utf-8", "replace") for v in values)
    return names


class ControlPlaneOnly(grpc.ServerInterceptor):
    """Refuse every call whose peer certificate does not name the control plane."""

    def __init__(self, name: str = CONTROL_PLANE_NAME) -> None:
        self._name = name

    def _allowed(self, context: grpc.ServicerContext) -> bool:
        return self._name in peer_names(context)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method

        def guard(behaviour: Callable[..., Any]) -> Callable[..., Any]:
            def checked(request: Any, context: grpc.ServicerContext) -> Any:
                if not self._allowed(context):
                    log.warning("refused %s: the peer certificate is not the control plane's (%s)",
                                method, context.peer())
                    context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                  f"only the control plane ({self._name}) may call this agent")
                return behaviour(request, context)
            return checked

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                guard(handler.unary_unary), handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                guard(handler.unary_stream), handler.request_deserializer, handler.response_serializer)
        # Client-streaming methods do not exist in this API; refuse rather than pass unchecked.
        return grpc.unary_unary_rpc_method_handler(
            lambda _request, context: context.abort(grpc.StatusCode.UNIMPLEMENTED, method))


class _Reloader:
    """Hands gRPC the serving certificate again whenever its files change."""

    def __init__(self, files: TLSFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        # Files found unusable: checked again (a child process) only once they change again.
        self._rejected: tuple[float, ...] = ()

    def _mtimes(self) -> tuple[float, ...]:
        try:
            return tuple(os.stat(p).st_mtime_ns for p in (self._files.key, self._files.cert, self._files.ca))
        except OSError:
            return ()

    def configuration(self) -> Any:
        # The files as they are: checked before serving starts (serve/identity); a renewal is
        # checked in __call__.
        key, cert, ca = self._files.pem()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def __call__(self) -> Any:
        # Called by gRPC at each handshake: cheap when nothing changed (None keeps the current one).
        with self._lock:
            stamp = self._mtimes()
            if not stamp or stamp in (self._stamp, self._rejected):
                return None
            try:
                identity.check_pair(self._files)
                config = self.configuration()
            except Exception as exc:  # a half-written renewal: keep serving the old one
                log.warning("new TLS files not usable yet: %s", exc)
                self._rejected = stamp
                return None
            self._stamp = stamp
            log.info("serving the renewed certificate %s", self._files.cert)
            return config


def server_credentials(files: TLSFiles) -> grpc.ServerCredentials:
    """TLS requiring a client certificate from the CA in ``files.ca``, reloaded on change.

    ``files`` are served as they are: check them first (``identity.check_pair``)."""
    reloader = _Reloader(files)
    return grpc.dynamic_ssl_server_credentials(reloader.configuration(), reloader,
                                               require_client_authentication=True)
