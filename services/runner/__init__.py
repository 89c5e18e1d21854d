"""The local runner (`geoserve run`): every service of a topology as an OS process."""

import os as _os

# The runner forks service processes while its own gRPC client (health checks, the
# snapshot wait) is alive: gRPC's fork handlers must be off, and gRPC reads this when it
# is first imported — so it is set here, before any module of the runner imports grpc.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

