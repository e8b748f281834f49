"""strata: train PyTorch models through stratad (ZeRO-Offload / ZeRO-Infinity).

    import strata.torch as st
    opt = st.OffloadAdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    model, opt = st.initialize(model, config="ds_config.json")

`strata.connect()` gives the low-level client (strata._native, a binding of
the C++ client library).
"""
from strata.errors import DaemonUnavailableError, StrataError
from strata.client import connect, default_socket_path, resolve_socket

__all__ = ["StrataError", "DaemonUnavailableError", "connect", "default_socket_path", "resolve_socket"]
__version__ = "0.1.0"
