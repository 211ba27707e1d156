"""One lab across several USB hosts, on Ray (the optional `[cluster]` extra).

Each lab host is a Ray node that advertises the devices plugged into it as custom resources
(`device:NAME`); a device's lane is an actor that needs that resource, so it runs on the node that holds
the device and no two runs ever drive it at once. The head — where `devicelab run --cluster` runs — keeps
the one ledger and does the host-side work once; files reach a node by content hash, into its own cache.

    node.py       a lab host joining the cluster (`devicelab head`, `devicelab worker`): checks, identity, ports
    tls.py        the lab's CA and per-host certificates for Ray's TLS
    blobs.py      a node's content-addressed cache of files fetched from the head
    head.py       the head's services (ledger, host work, events) and the lane actor that calls them
    placement.py  the driver's side: lanes placed on their devices' nodes, faults, waiting for a held device
"""

RESOURCE_PREFIX = "device:"
NODE_CACHE_ENV = "DEVICELAB_NODE_CACHE"  # a node's cache of files fetched from the head
KV_NAMESPACE = b"devicelab"
IDENTITY_KEY = b"identity"


def resource(device: str) -> str:
    """The custom resource a lab host advertises for one of its devices."""
    return RESOURCE_PREFIX + device


def claim_key(device: str) -> bytes:
    """A lab host's claim on a device, taken before it advertises it (node.claim_devices)."""
    return f"claim/{device}".encode()


def lease_key(device: str) -> bytes:
    return f"lease/{device}".encode()
