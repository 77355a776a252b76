"""The Python SDK: `Client` (sync) and `AsyncClient` over httpx, typed models, problem errors."""

from ipucloud.sdk._core import RetryPolicy
from ipucloud.sdk.aclient import AsyncClient
from ipucloud.sdk.client import Client
from ipucloud.sdk.config import config_path, load_config, resolve, save_config
from ipucloud.sdk.errors import (
    ApiError,
    AuthError,
    ConfigurationError,
    ConflictError,
    InvalidRequestError,
    IpucloudError,
    NotFoundError,
    QuotaError,
    RateLimitError,
    ServerError,
    ServiceUnreachable,
)
from ipucloud.sdk.models import (
    FINAL_STATES,
    Estimate,
    Fleet,
    Job,
    LogEntry,
    Page,
    Partition,
    Progress,
    StreamEvent,
    Tenant,
    TenantCreated,
    TrialApplication,
    Usage,
)

__all__ = [
    "FINAL_STATES",
    "ApiError",
    "AsyncClient",
    "AuthError",
    "Client",
    "ConfigurationError",
    "ConflictError",
    "Estimate",
    "Fleet",
    "InvalidRequestError",
    "IpucloudError",
    "Job",
    "LogEntry",
    "NotFoundError",
    "Page",
    "Partition",
    "Progress",
    "QuotaError",
    "RateLimitError",
    "RetryPolicy",
    "ServerError",
    "ServiceUnreachable",
    "StreamEvent",
    "Tenant",
    "TenantCreated",
    "TrialApplication",
    "Usage",
    "config_path",
    "load_config",
    "resolve",
    "save_config",
]
