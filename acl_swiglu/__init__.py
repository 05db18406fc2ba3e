"""acl-swiglu: aclnnSwigluGroupQuantGrad from Python, on Ascend or on the bundled CPU emulator."""

__version__ = "0.1.0"
