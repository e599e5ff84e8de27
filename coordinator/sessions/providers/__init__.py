"""Sandbox providers: the protocol, local Jupyter kernels, and E2B."""

from .base import OutputBuffer, RunOutput, Sandbox, SandboxInfo, SandboxProvider
from .local import LocalKernelProvider

__all__ = ["LocalKernelProvider", "OutputBuffer", "RunOutput", "Sandbox", "SandboxInfo",
           "SandboxProvider"]
