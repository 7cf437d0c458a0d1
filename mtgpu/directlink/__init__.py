"""DirectLink: connections between members and clients through NAT (docs/DIRECTLINK.md)."""
