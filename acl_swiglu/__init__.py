"""acl-swiglu: Ascend's aclnnSwigluGroupQuantGrad (SwiGLU backward with MoE weights, clamp and
group truncation) and aclnnSwigluGroupQuant (the forward, with FP8/FP4 quantisation) from Python,
on a real CANN install or on the bundled CPU emulator.

Importing loads nothing; the libraries are found and loaded on first use (see backend_info()).
"""

from typing import TYPE_CHECKING, Any

from . import emulator, formats, reference
from ._dtypes import bfloat16_dtype
from ._loader import BackendInfo, abi_revision, backend_info
from .errors import (
    AclError,
    AclInternalError,
    AclParameterError,
    AclResourceError,
    AclRuntimeFailure,
    AclSwigluError,
    AclSwigluWarning,
    ArgumentError,
    ConfigurationError,
    HandleClosedError,
    HostMemoryError,
    LibraryNotFoundError,
)
from .op import (
    Executor,
    SwigluGroupQuantGradPlan,
    get_workspace_size,
    release_cached,
    swiglu_group_quant_grad,
    swiglu_group_quant_grad_device,
)
from .forward import SwigluGroupQuantPlan, swiglu_group_quant, swiglu_group_quant_device
from ._device import DeviceArray, DeviceBuffer, Stream, default_stream, to_device
from .runtime import set_device, synchronize_device

__version__ = "0.1.0"

if TYPE_CHECKING:
    import numpy as np
    bfloat16: np.dtype


def __getattr__(name: str) -> Any:
    # bfloat16 (ml_dtypes' dtype) is made on first use: importing ml_dtypes costs more than
    # importing everything else here.
    if name == "bfloat16":
        return bfloat16_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "emulator", "formats", "reference",
    "AclError", "AclInternalError", "AclParameterError", "AclResourceError", "AclRuntimeFailure", "AclSwigluError", "AclSwigluWarning",
    "ArgumentError", "BackendInfo", "ConfigurationError", "DeviceArray", "DeviceBuffer", "Executor",
    "HandleClosedError", "HostMemoryError", "LibraryNotFoundError", "Stream", "SwigluGroupQuantGradPlan", "SwigluGroupQuantPlan", "abi_revision",
    "backend_info", "bfloat16", "default_stream", "get_workspace_size", "release_cached", "set_device", "swiglu_group_quant", "swiglu_group_quant_device", "swiglu_group_quant_grad",
    "swiglu_group_quant_grad_device", "synchronize_device", "to_device",
]
