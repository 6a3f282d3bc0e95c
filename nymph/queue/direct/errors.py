"""Kubernetes and credential failures as the queue's HTTP errors. What the API server said is
relayed only as the ``message`` of a Kubernetes Status (cut short, see
:func:`nymph.kube.api.status_error`); any other answer is "the server answered HTTP N"."""

from __future__ import annotations

from nymph.errors import CredentialsError
from nymph.kube import errors as kube
from nymph.kube.netguard import ServerNotAllowed
from nymph.queue.errors import BadRequest, ServiceError
from nymph.queue.secrets import SecretKeyError


class KubeForbidden(ServiceError):
    status = 403
    default_code = "kube_forbidden"


class KubeInvalid(ServiceError):
    status = 422
    default_code = "kube_invalid"


class KubeConflict(ServiceError):
    status = 409
    default_code = "kube_conflict"


class KubeFailed(ServiceError):
    status = 502
    default_code = "kube_error"


class KubeUnavailable(ServiceError):
    status = 503
    default_code = "kube_unavailable"


class KubeServerRefused(ServiceError):
    """A user-supplied kubeconfig named a server the queue may not connect to."""

    status = 403
    default_code = "kube_server_refused"


class SecretKeyProblem(ServiceError):
    status = 500
    default_code = "secret_key"


class CannotStage(ServiceError):
    status = 500
    default_code = "queue_tmp_unwritable"


def service_error(exc: Exception, *, what: str) -> ServiceError:
    """``what`` says what was being done ("creating Pod lakeshore-1a2b3c4d in jobs")."""
    if isinstance(exc, SecretKeyError):
        return SecretKeyProblem(str(exc))
    if isinstance(exc, CredentialsError):
        return BadRequest(str(exc), code="invalid_kubeconfig")
    if isinstance(exc, ServerNotAllowed):  # before anything was sent: the message names the flag
        return KubeServerRefused(f"refused {what}: {exc.message}")
    if isinstance(exc, kube.KubeError):
        said = f"the Kubernetes API server refused {what}: {exc.message}"
        if isinstance(exc, (kube.Forbidden, kube.Unauthorized)):
            return KubeForbidden(
                said, code="kube_unauthorized" if isinstance(exc, kube.Unauthorized) else None
            )
        if isinstance(exc, kube.Invalid):
            return KubeInvalid(said)
        if isinstance(exc, (kube.Conflict, kube.AlreadyExists)):
            return KubeConflict(said)
        if isinstance(exc, kube.Unavailable):
            return KubeUnavailable(
                f"the Kubernetes API server could not be reached for {what}: {exc.message}"
            )
        return KubeFailed(said)
    if isinstance(exc, OSError):  # staging needs a private temp dir; no path or content is quoted
        return CannotStage(
            f"the queue could not stage credentials for {what}: no writable temporary directory "
            f"({exc.__class__.__name__}); give the queue a writable /tmp (the shipped manifests mount "
            "a memory-backed emptyDir there) or set TMPDIR"
        )
    raise exc
