"""balanceroute-shadow: decide, on your own traffic, whether BalanceRoute should route decode."""

__version__ = "0.1.0"
