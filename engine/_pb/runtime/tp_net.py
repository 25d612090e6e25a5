"""Where the tensor-parallel ranks meet, for a server others can reach.

torch's `init_method="env://"` has rank 0's rendezvous store listen on every interface of its
host, and gloo and nccl pick their own interface unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME
name one. Here the store listens on MASTER_ADDR alone, and both default to the interface that
reaches MASTER_ADDR (the loopback for ranks on one host; a value the operator set wins).
"""

import errno
import ipaddress
import os
import socket
from datetime import timedelta


class RendezvousError(RuntimeError):
    """Rank 0 cannot listen where it was told; worded for the operator."""


def rendezvous_store(rank: int, world_size: int, addr: str, port: int, timeout: timedelta):
    """The group's TCPStore, as `init_method="env://"` makes it, except that rank 0 listens on addr
    alone: torch's own store binds every interface, and whoever reaches the port can write it."""
    from torch.distributed import TCPStore

    use_libuv = os.environ.get("USE_LIBUV", "1") == "1"  # torch's env:// default
    if rank != 0:
        return TCPStore(addr, port, world_size, is_master=False, timeout=timeout, use_libuv=use_libuv)
    listener = listen(addr, port)
    # The store takes the socket over (and closes it); Python must not close it as well.
    return TCPStore(addr, port, world_size, is_master=True, timeout=timeout, use_libuv=use_libuv,
                    master_listen_fd=listener.detach())


def listen(addr: str, port: int) -> socket.socket:
    """A socket listening on addr:port alone, or RendezvousError naming the fix."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise RendezvousError(f"MASTER_ADDR={addr} does not resolve ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(sockaddr)
        sock.listen(socket.SOMAXCONN)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise RendezvousError(f"rendezvous port {port} on {addr} is in use by another process (MASTER_PORT)"
                                  ) from None
        raise RendezvousError(f"rank 0 cannot listen on MASTER_ADDR={addr} port {port} ({e.strerror}): "
                              "MASTER_ADDR must be an address of rank 0's host") from None
    return sock


# The variables torch's gloo and nccl read for the interface they bind and dial from.
IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915


def default_interfaces(addr: str) -> str:
    """Set each of IFNAME_ENV the operator left unset to the interface toward addr; the settings
    now in force, for the log."""
    ifname = interface_toward(addr)
    for key in IFNAME_ENV:
        if ifname and not os.environ.get(key):
            os.environ[key] = ifname
    return ", ".join(f"{key}={os.environ[key]}" for key in IFNAME_ENV if os.environ.get(key)) or \
        "no interface toward it found: gloo and nccl pick theirs"


def interface_toward(addr: str) -> str | None:
    """The name of this host's interface that reaches addr (the one holding it on rank 0), or None
    where it cannot be told (then gloo and nccl choose, as without this)."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, 1, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)  # no packet is sent: this asks the routing table for the source address
            local = ipaddress.ip_address(probe.getsockname()[0].split("%")[0])
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, ValueError):
        return None
    for name in names:
        if local in _addresses(name, family):
            return name
    return None


def _addresses(name: str, family) -> set:
    if family == socket.AF_INET:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                return set()
        return {ipaddress.ip_address(raw[20:24])}
    try:
        with open("/proc/net/if_inet6") as f:
            rows = [line.split() for line in f]
    except OSError:
        return set()
    return {ipaddress.ip_address(bytes.fromhex(r[0])) for r in rows if len(r) == 6 and r[5] == name}
